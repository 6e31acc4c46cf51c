"""Task encoders: one file per task kind behind the small `TaskEncoder` protocol (base.py)."""
