"""Shell completion as the README documents it: the installed `jobpool` script prints a completion script
for bash, zsh and fish (click's `_JOBPOOL_COMPLETE=<shell>_source`), and the bash one, sourced into a real
bash, completes commands and options."""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The console script pip installed for this interpreter, as a user's shell runs it.
SCRIPTS = Path(sysconfig.get_path("scripts"))

#: What each shell's script must contain to register itself for the `jobpool` command.
REGISTERS = {
    "bash": "complete -o nosort -F _jobpool_completion jobpool",
    "zsh": "compdef _jobpool_completion jobpool",
    "fish": "complete --no-files --command jobpool",
}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{SCRIPTS}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def test_the_readme_gives_the_line_for_each_shell() -> None:
    readme = (ROOT / "README.md").read_text()
    for shell in REGISTERS:
        assert re.search(rf"_JOBPOOL_COMPLETE={shell}_source jobpool", readme), shell


@pytest.mark.parametrize("shell", sorted(REGISTERS))
def test_jobpool_prints_a_completion_script(shell: str) -> None:
    assert (SCRIPTS / "jobpool").exists(), f"jobpool is not installed for this interpreter ({SCRIPTS})"
    out = subprocess.run(["jobpool"], env=_env(_JOBPOOL_COMPLETE=f"{shell}_source"), capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert REGISTERS[shell] in out.stdout, out.stdout


def test_bash_completes_commands_and_options() -> None:
    # The README's line, then what bash does on TAB: the completion function, called with the command name.
    script = """
        eval "$(_JOBPOOL_COMPLETE=bash_source jobpool)"
        COMP_WORDS=(jobpool enq); COMP_CWORD=1; _jobpool_completion jobpool; echo "${COMPREPLY[*]}"
        COMPREPLY=(); COMP_WORDS=(jobpool enqueue --coal); COMP_CWORD=2; _jobpool_completion jobpool
        echo "${COMPREPLY[*]}"
    """
    out = subprocess.run(["bash", "-c", script], env=_env(), capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["enqueue", "--coalesce --coalesce-key"], out.stdout
