#!/usr/bin/env bash
# Builds the C# handlers with Mono's mcs into OUT_DIR (default handlers/dotnet/build):
#
#   handlers/dotnet/build.sh /tmp/dsm-dotnet
#   dsm verify --exec "mono /tmp/dsm-dotnet/MemoryHandler.exe" --profile ci
#
# Needs Debian's mono-devel, libmono-sqlite4.0-cil and libnewtonsoft-json-cil-dev; with
# libnunit-cil-dev it also builds Dsm.DataStateMachine.NUnit.dll.
# The .csproj files beside the sources are for a team's `dotnet build` instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/build}"
mkdir -p "$out"

sources() { find "$here/$1" -name '*.cs' -not -path '*/obj/*' -not -path '*/bin/*' | sort; }
build() { mcs -nologo -debug -langversion:7.2 -warnaserror+ "$@"; }

mapfile -t core < <(sources Dsm.DataStateMachine)
mapfile -t sqlite < <(sources Dsm.DataStateMachine.Sqlite)
mapfile -t broken < <(sources Broken)
mapfile -t examples < <(sources Examples)
mapfile -t seed < <(sources SeedHandler)

build -t:library -r:System.Data \
  -out:"$out/Dsm.DataStateMachine.dll" "${core[@]}"
build -t:library -r:"$out/Dsm.DataStateMachine.dll" -r:System.Data -r:Mono.Data.Sqlite \
  -out:"$out/Dsm.DataStateMachine.Sqlite.dll" "${sqlite[@]}"
build -r:"$out/Dsm.DataStateMachine.dll" \
  -out:"$out/MemoryHandler.exe" "$here/MemoryHandler/Program.cs"
build -r:"$out/Dsm.DataStateMachine.dll" -r:"$out/Dsm.DataStateMachine.Sqlite.dll" \
  -out:"$out/SqliteHandler.exe" "$here/SqliteHandler/Program.cs"
build -r:"$out/Dsm.DataStateMachine.dll" \
  -out:"$out/SeedHandler.exe" "${seed[@]}"
build -pkg:newtonsoft-json -r:"$out/Dsm.DataStateMachine.dll" -r:"$out/Dsm.DataStateMachine.Sqlite.dll" \
  -out:"$out/BrokenHandler.exe" "${broken[@]}"
build -pkg:newtonsoft-json -r:"$out/Dsm.DataStateMachine.dll" -r:"$out/Dsm.DataStateMachine.Sqlite.dll" \
  -out:"$out/InvoiceExample.exe" "${examples[@]}"

# The NUnit cases of dsm verify (Dsm.DataStateMachine.NUnit), where NUnit is installed
# (Debian's libnunit-cil-dev); nothing else here needs it.
if pkg-config --exists nunit 2>/dev/null; then
  mapfile -t nunit < <(sources Dsm.DataStateMachine.NUnit)
  build -t:library -pkg:nunit -r:System.Runtime.Serialization \
    -out:"$out/Dsm.DataStateMachine.NUnit.dll" "${nunit[@]}"
fi

# Compile the handlers' own code ahead of time: the kit starts a process per test case,
# and each would otherwise JIT the host again (about a quarter of a process's CPU).
# Mono uses an image only while it matches its assembly; without one it JITs as before.
for assembly in Dsm.DataStateMachine.dll Dsm.DataStateMachine.Sqlite.dll MemoryHandler.exe SqliteHandler.exe SeedHandler.exe; do
  mono --aot -O=all "$out/$assembly" >/dev/null 2>&1 || echo "build.sh: no AOT image for $assembly (it runs JIT-compiled)" >&2
done
