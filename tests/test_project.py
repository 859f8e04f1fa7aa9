"""The project's own conventions: one repository URL, Colab install cells, stripped notebooks."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def repository_url():
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def test_pyproject_names_the_configured_repository():
    assert f'Repository = "{repository_url()}"' in (ROOT / "pyproject.toml").read_text()


def test_every_notebook_installs_on_colab_only_and_keeps_torch():
    url = repository_url()
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert '"google.colab" in sys.modules' in first, path.name
        assert f"minicompile @ git+{url}" in first, f"{path.name}: run `make sync-url`"
        for line in first.splitlines():
            if "pip install" in line:
                packages = line.split("#")[0].split("pip install", 1)[1].split()
                assert not any(re.match(r"['\"]?(torch|triton)\b", p) for p in packages), \
                    f"{path.name} must not reinstall torch or triton"


def test_notebooks_in_the_table_of_contents_exist():
    toc = (ROOT / "_toc.yml").read_text()
    for entry in re.findall(r"file:\s*(\S+)", toc):
        assert list(ROOT.glob(entry + ".*")), entry
