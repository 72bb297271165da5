"""The kernel menu suite (``tasks=kernel_menu``): references whose answers name an option of a menu of real kernels."""
from kevin_exp.tasks.kernel_menu.answers import MenuAnswer, option_in, parse_menu_answer
from kevin_exp.tasks.kernel_menu.menu import KINDS, SYMBOLS, MenuProblem, load_menu, symbols

__all__ = ["KINDS", "SYMBOLS", "MenuAnswer", "MenuProblem", "load_menu", "option_in", "parse_menu_answer", "symbols"]
