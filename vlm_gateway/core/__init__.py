"""The ground floor: the request model, the error hierarchy and the stage contract.

Imports nothing else from the package; stages, backends, the HTTP layer and the CLI
all build on it (docs/ARCHITECTURE.md)."""
