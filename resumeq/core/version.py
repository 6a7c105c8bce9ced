"""resumeq's version, where every layer may read it (a config digest is named by it)."""

__version__ = "0.1.0"
