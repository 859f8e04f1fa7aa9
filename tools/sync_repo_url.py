"""Copy the repository URL from _config.yml (its one home) into pyproject.toml and each
notebook's Colab install cell. `make sync-url` runs this; tests/test_project.py checks the copies."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r'minicompile @ git\+(\S+?)"')


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def main():
    url = repository_url()
    pyproject = ROOT / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^Repository = ".*"$', f'Repository = "{url}"', pyproject.read_text()))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        first = nb["cells"][0]
        first["source"] = [INSTALL.sub(f'minicompile @ git+{url}"', line) for line in first["source"]]
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"repository URL {url} copied into pyproject.toml and the notebooks")


if __name__ == "__main__":
    main()
