"""Copy the repository URL from _config.yml (its one home) into pyproject.toml and the README's
install command, and write each notebook's first cell, the Colab install cell, from INSTALL_CELL with that URL. `make sync-url`
runs this; tests/test_project.py checks the copies and runs the cell with the install failing."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# On Colab only: install minicompile from the repository without touching Colab's torch; if
# that fails (no network, a private or moved repository), say what to do instead.
INSTALL_CELL = '''import subprocess, sys
if "google.colab" in sys.modules:  # on Colab: install minicompile, keep Colab's torch
    PACKAGE = "minicompile @ git+{url}"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", PACKAGE],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError(f"pip could not install {{PACKAGE}}:\\n{{pip.stderr[-1500:]}}\\n"
                           "Instead: clone the repository, run `pip install -e .` in it and open the "
                           "notebooks there; or build a wheel there (`pip wheel --no-deps .`), "
                           "upload it here and `pip install` it.")'''


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def install_cell(url: str) -> str:
    return INSTALL_CELL.format(url=url)


def main():
    url = repository_url()
    pyproject = ROOT / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^Repository = ".*"$', f'Repository = "{url}"', pyproject.read_text()))
    readme = ROOT / "README.md"
    readme.write_text(re.sub(r'minicompile @ git\+[^"\s]+"', f'minicompile @ git+{url}"', readme.read_text()))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        first = next(cell for cell in nb["cells"] if cell["cell_type"] == "code")
        first["source"] = install_cell(url).splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"repository URL {url} copied into pyproject.toml, README.md and the notebooks' install cells")


if __name__ == "__main__":
    main()
