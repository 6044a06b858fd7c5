#!/usr/bin/env bash
# Regenerates topic_broker/pulsar_api_pb2.py and pulsar_api_pb2.pyi from topic_broker/pulsar_api.proto.
#
# Code from a newer protoc refuses to import on an older protobuf runtime (protoc >= 27 writes a version check),
# so we generate with the protoc of grpcio-tools $GRPCIO_TOOLS_VERSION (protoc 26.1, gencode 5.26.1, no check):
# the committed code imports on every protobuf from setup.cfg's floor (5.26) up to the newest runtime (7.x). The tool
# lives in its own venv under ~/.cache (created on first use). To use another interpreter with grpcio-tools
# (e.g. PROTOC_PYTHON=.venv/bin/python), the script still refuses gencode newer than setup.cfg's protobuf floor.
set -euo pipefail
cd "$(dirname "$0")/.."

GRPCIO_TOOLS_VERSION=${GRPCIO_TOOLS_VERSION:-1.63.0}
if [ -z "${PROTOC_PYTHON:-}" ]; then
    tool_venv=${XDG_CACHE_HOME:-$HOME/.cache}/ledgerstore/gen-proto-grpcio-tools-$GRPCIO_TOOLS_VERSION
    if [ ! -x "$tool_venv/bin/python" ]; then
        python3 -m venv "$tool_venv"
        "$tool_venv/bin/pip" install -q "grpcio-tools==$GRPCIO_TOOLS_VERSION"
    fi
    PROTOC_PYTHON=$tool_venv/bin/python
fi

"$PROTOC_PYTHON" -m grpc_tools.protoc --proto_path=. --python_out=. --pyi_out=. topic_broker/pulsar_api.proto

# protoc's stub generator writes Schema.Type's value `None` as an attribute (a syntax error in a stub) and lets
# Schema's value `KeyValue` shadow the KeyValue message inside class Schema. Drop those attributes from the stub
# only; at run time they are Schema.Type.Value("None") and Schema.Type.Value("KeyValue").
"$PROTOC_PYTHON" - <<'PY'
import pathlib
import re

path = pathlib.Path("topic_broker/pulsar_api_pb2.pyi")
lines = path.read_text().splitlines(keepends=True)
keep = [
    line
    for line in lines
    if not re.match(r"^\s*None: ", line) and not re.match(r"^    KeyValue: Schema\.Type$", line.rstrip("\n"))
]
path.write_text("".join(keep))
PY

gencode=$(tr -d ' \n' < topic_broker/pulsar_api_pb2.py \
    | sed -n 's/.*ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC,\([0-9]*\),\([0-9]*\),\([0-9]*\),.*/\1.\2.\3/p')
floor=$(sed -n 's/^ *protobuf>=\([0-9.]*\).*/\1/p' setup.cfg | head -1)
echo "generated with $("$PROTOC_PYTHON" -m grpc_tools.protoc --version): gencode ${gencode:-unchecked}, setup.cfg protobuf>=${floor:-?}"
if [ -n "$gencode" ] && [ -n "$floor" ]; then
    newest=$(printf '%s\n%s\n' "$gencode" "$floor" | sort -V | tail -1)
    if [ "$newest" != "$floor" ]; then
        echo "error: gencode $gencode needs protobuf>=$gencode but setup.cfg allows protobuf>=$floor" >&2
        exit 1
    fi
fi
