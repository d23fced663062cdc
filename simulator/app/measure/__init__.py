"""Scripts that measure ../shared/traces and write the calibration data the policies and the
cache model read (each `python -m simulator.app.measure.<name>`; --check where it writes)."""
