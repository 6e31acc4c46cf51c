"""tunepilot: one complete step before a thousand attempts.

The package root stays import-light on purpose: `tunepilot --help` and `tunepilot validate`
must answer without importing torch, transformers or peft.
"""

__version__ = "0.1.0"
