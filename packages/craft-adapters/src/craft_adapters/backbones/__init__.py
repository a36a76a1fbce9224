"""One module per supported backbone; each registers a `BackboneAdapter` subclass."""
