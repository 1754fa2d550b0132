#!/usr/bin/env python3
"""Flattens JSON-Schema-Test-Suite into JSON lines for tests/grammar/test_jsts.c.

One line per test group: {set, file, group, desc, draft, schema, tests:
[{text, valid, desc}]}, where text is the instance's canonical JSON text,
Python's json.dumps with default separators (", " and ": ") and ASCII
escapes -- the form the acceptance criterion names. Usage:
  jsts_prep.py SUITE_TESTS_DIR > out.jsonl
SUITE_TESTS_DIR is ../shared/data/json-schema-test-suite/tests.
"""
import glob
import json
import os
import sys

root = sys.argv[1]
for d, draft in (("draft2020-12", 2020), ("draft7", 7)):
    for path in sorted(glob.glob(f"{root}/{d}/**/*.json", recursive=True)):
        rel = os.path.relpath(path, root)
        kind = "optional" if "/optional/" in rel else "required"
        for gi, g in enumerate(json.load(open(path, encoding="utf-8"))):
            print(json.dumps({
                "set": f"{d}/{kind}", "file": rel, "group": gi, "desc": g["description"],
                "draft": draft, "schema": g["schema"],
                "tests": [{"text": json.dumps(t["data"]), "valid": t["valid"],
                           "desc": t["description"]} for t in g["tests"]],
            }))
