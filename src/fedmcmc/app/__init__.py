"""The application layer: command line, run configuration, problem registry, paper studies and benchmarks.

The library does not import this package."""
