"""The kernel menu suite (``tasks=kernel_menu``): references whose answers are a letter of a menu of real kernels."""
from kevin_exp.tasks.kernel_menu.answers import OPTIONS, MenuAnswer, parse_menu_answer
from kevin_exp.tasks.kernel_menu.menu import KINDS, LETTERS, PROFILE, MenuProblem, load_menu

__all__ = ["KINDS", "LETTERS", "OPTIONS", "PROFILE", "MenuAnswer", "MenuProblem", "load_menu", "parse_menu_answer"]
