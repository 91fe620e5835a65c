"""oncewatch: proves from the outside that every payment side effect happened exactly once."""

__version__ = "0.1.0"
