"""What every ctitan benchmark prints beside its rows: the CPU model and the matmul engine and
ISA the rows ran on (ctitan's start-up "compute:" line), printed once per benchmark.

  import ctbench; ctbench.engine_line(text_of_a_ctitan_run)
"""

_SEEN = []


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def engine_line(text):
    """Print 'CPU ...; compute: <engine, ISA>' from a ctitan log, the first time only."""
    if _SEEN:
        return
    for line in text.splitlines():
        if "compute:" in line:
            _SEEN.append(line)
            print(f"CPU {cpu_name()}; compute: {line.split('compute:', 1)[1].strip()}",
                  flush=True)
            return
