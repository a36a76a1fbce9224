"""craft-train: two-stage training of the CRAFT merge module (work in progress, issue 6).

Nothing trains yet: `craft-train` says so and exits with an error rather than pretending.
"""

__version__ = "0.1.0"
