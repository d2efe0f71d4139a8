#!/usr/bin/env python3
"""Copies one of etcd's .proto files without what protoc cannot resolve here:
the gogoproto import and options (Go code generation hints) and the
google.api.http annotations (the JSON gateway's routes). Neither changes the
wire format, so the C++ stubs made from the result talk to etcd as its own Go
client does. Reads stdin, writes stdout."""

import re
import sys


def drop_http_options(text):
    """Removes every `option (google.api.http) = { ... };`, nested braces
    (additional_bindings) included."""
    out = []
    at = 0
    opener = re.compile(r"option \(google\.api\.http\)\s*=\s*\{")
    while True:
        m = opener.search(text, at)
        if m is None:
            out.append(text[at:])
            return "".join(out)
        out.append(text[at:m.start()])
        depth, i = 1, m.end()
        while depth > 0:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == ";":
            i += 1
        at = i


text = drop_http_options(sys.stdin.read())
lines = []
for line in text.splitlines():
    if re.match(r'\s*import "(gogoproto/gogo|google/api/annotations)\.proto";',
                line):
        continue
    if re.match(r"\s*option \(gogoproto\.[a-z_]+\)\s*=", line):
        continue
    # Field options such as [(gogoproto.nullable) = false].
    line = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", line)
    lines.append(line)
sys.stdout.write("\n".join(lines) + "\n")
