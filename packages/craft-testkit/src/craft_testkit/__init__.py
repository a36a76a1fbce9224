"""The CRAFT workspace's test helpers: a real full disk and README examples run as tests.

Not a library: every package's `test` dependency group installs it, no package depends on it.
"""
