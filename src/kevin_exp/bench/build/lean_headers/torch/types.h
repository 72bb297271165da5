// Lean shadow of <torch/types.h> (see kx_lean_core.h).
#pragma once
#include <kx_lean_core.h>
