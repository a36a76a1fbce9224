"""Public config values of the architectures `craft-eval efficiency` builds (JSON)."""
