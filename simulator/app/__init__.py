"""The application: the CLI, the Python API, sweeps, tuning, fidelity and writing run
directories. It wires readers, policies and reports to the core; the core never imports it."""
