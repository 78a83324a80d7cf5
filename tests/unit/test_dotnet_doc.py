"""docs/dotnet.md says what the C# build needs and names the package versions the projects use."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "dotnet.md").read_text(encoding="utf-8")


def test_the_doc_names_the_sqlite_package_version_of_the_csproj() -> None:
    csproj = ROOT / "handlers/dotnet/Dsm.DataStateMachine.Sqlite/Dsm.DataStateMachine.Sqlite.csproj"
    version = re.search(
        r'Include="Microsoft.Data.Sqlite" Version="([^"]+)"', csproj.read_text(encoding="utf-8")
    )
    assert version is not None
    assert f"Microsoft.Data.Sqlite {version.group(1)}" in DOC
    assert set(re.findall(r"Microsoft.Data.Sqlite (\d[\w.]*)", DOC)) == {version.group(1)}


def test_the_doc_gives_the_apt_get_line_and_the_rules_a_handler_must_keep() -> None:
    packages = (
        "mono-devel libmono-sqlite4.0-cil libnewtonsoft-json-cil-dev libnunit-cil-dev nunit-console"
    )
    assert f"apt-get install {packages}" in DOC
    assert "each `open` must start from an empty store" in DOC
    assert "--tokens ordered" in DOC and "cannot see" in DOC and "-debug" in DOC
    # The first factory the quick start shows gives each open a store of its own.
    first = DOC.index("DsmProtocolHost.Run(args, ")
    assert DOC[first:].startswith("DsmProtocolHost.Run(args, clock => new MyHandler(clock));")


def test_the_doc_names_the_test_package_versions_of_the_csproj_files() -> None:
    dotnet = ROOT / "handlers/dotnet"
    projects = (
        dotnet / "Dsm.DataStateMachine.Tests/Dsm.DataStateMachine.Tests.csproj",
        dotnet / "Dsm.DataStateMachine.NUnit/Dsm.DataStateMachine.NUnit.csproj",
    )
    named: dict[str, set[str]] = {}
    for project in projects:
        text = project.read_text(encoding="utf-8")
        for package, version in re.findall(
            r'PackageReference Include="([^"]+)" Version="([^"]+)"', text
        ):
            named.setdefault(package, set()).add(version)
    assert set(named) == {"NUnit", "NUnit3TestAdapter", "Microsoft.NET.Test.Sdk"}
    for package, versions in named.items():
        assert len(versions) == 1, (package, versions)  # one version of a package in every project
        assert f"{package} {versions.pop()}" in DOC, package
