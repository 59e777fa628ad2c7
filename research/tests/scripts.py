"""Load a research script as a module, for the tests of research/scripts."""
import importlib


def load_script(name: str):
    """The module research/scripts/<name>.py."""
    return importlib.import_module(f"research.scripts.{name}")
