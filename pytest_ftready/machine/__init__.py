"""The machine: probes that read it (NVML, torch, host, kernels) into plain records, the
device a recipe resolves to, the environment record, telemetry sampling, the hub and its
cache, installed versions against pins, and the compatibility facts shipped as data.

Imports only the recipe and foundation modules; never the data path, the engine, the
session, the checks or pytest. Tests substitute a fake ``Machine`` built from the same
records through the ``pytest_ftready_machine`` hook."""
