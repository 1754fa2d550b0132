#!/usr/bin/env python3
"""Flattens the MaskBench sample (../shared/data/maskbench-dev) into JSON
lines for tests/grammar/test_maskbench.c: {file, schema, tests: [{text,
valid}]}, text = Python json.dumps of the instance.
Usage: maskbench_prep.py DIR > out.jsonl"""
import glob
import json
import os
import sys

for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(path, encoding="utf-8"))
    print(json.dumps({"file": os.path.basename(path), "schema": d["schema"],
                      "tests": [{"text": json.dumps(t["data"]), "valid": t["valid"]} for t in d["tests"]]}))
