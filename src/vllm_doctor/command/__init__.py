"""The command model (parse / edit / render every launch shape) and flag knowledge. See docs/DESIGN.md."""
from .edits import DockerOption, Edit, RemoveFlag, SetEnv, SetFlag
from .model import Command

__all__ = ["Command", "DockerOption", "Edit", "RemoveFlag", "SetEnv", "SetFlag"]
