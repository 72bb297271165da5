// Lean shadow of <ATen/ATen.h> (see kx_lean_core.h).
#pragma once
#include <kx_lean_core.h>
