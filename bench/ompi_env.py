"""The OpenMPI environment of local launches, read from scripts/ompi.env (its one home)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ompi_env():
    env = {}
    with open(os.path.join(ROOT, "scripts", "ompi.env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k] = v
    return env
