"""The contract between algorithms and runtimes, shared types and the checks every builder uses."""
