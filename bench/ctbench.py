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


def run(cmd, env, cwd):
    """Run a command, its output as text; exit naming it and its tail when it fails."""
    import subprocess
    import sys
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    text = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{text[-4000:]}")
    return text


def load():
    """The 1-minute load average, as /proc/loadavg prints it."""
    return open("/proc/loadavg").read().split()[0]
