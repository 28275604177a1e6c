"""The command model (parse / edit / render every launch shape) and flag knowledge. See docs/DESIGN.md."""
from .edits import DockerOption, DropLauncher, Edit, RemoveFlag, SetEnv, SetFlag, SetModel
from .model import Command

__all__ = ["Command", "DockerOption", "DropLauncher", "Edit", "RemoveFlag", "SetEnv", "SetFlag", "SetModel"]
