"""Package mapping: each top-level folder is a subpackage of `corral`.

Automatic discovery cannot follow a mapping of sibling folders onto one namespace, so the
package list is computed here from the folders themselves; adding a subpackage needs no edit.
"""

from setuptools import find_packages, setup

ROOTS = {
    "corral": "sdk",
    "corral.sandbox": "sandbox",
    "corral.envs": "envs",
    "corral.registry": "registry",
    "corral.integrations": "integrations",
    "corral.serve": "serve",
    "corral.runner": "runner",
    "corral.trainer": "trainer",
    "corral.cli": "cli",
}
DATA = ["*.toml", "*.json", "*.jsonl", "*.html", "*.js", "*.css", "*.sh", "*.md", "*.txt",
        "Dockerfile", "py.typed"]


def packages() -> tuple[list[str], dict[str, str]]:
    names, dirs = [], dict(ROOTS)
    for name, folder in ROOTS.items():
        names.append(name)
        for sub in find_packages(folder):
            names.append(f"{name}.{sub}")
            dirs[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return names, dirs


names, dirs = packages()
setup(packages=names, package_dir=dirs, package_data={name: DATA for name in names})
