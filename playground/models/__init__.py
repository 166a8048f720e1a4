"""Finding, fetching, converting and loading models; device and dtype choice."""
