#!/usr/bin/env python3
"""Validates a SARIF log: against the SARIF 2.1.0 schema subset next to this
file (with format checks), then against what GitHub code scanning needs from
tensor-tidy: rules with descriptions, help URI and default level; results
with a rule, a location, and a partial fingerprint; fixes and related
locations that point somewhere. Prints one line per problem."""
import json
import os
import sys

import jsonschema


def main():
    log = json.load(open(sys.argv[1], encoding="utf-8"))
    schema = json.load(open(os.path.join(os.path.dirname(__file__),
                                         "sarif-2.1.0-required.schema.json")))
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    problems = ["schema: %s at %s" % (e.message, "/".join(map(str, e.absolute_path)))
                for e in validator.iter_errors(log)]
    for run in log.get("runs", []):
        rules = run["tool"]["driver"].get("rules", [])
        ids = [r["id"] for r in rules]
        if len(ids) != len(set(ids)):
            problems.append("duplicate rule ids")
        for r in rules:
            for key in ("shortDescription", "fullDescription", "helpUri", "defaultConfiguration"):
                if key not in r:
                    problems.append("rule %s has no %s" % (r["id"], key))
        fingerprints = set()
        for res in run.get("results", []):
            if res.get("ruleId") not in ids or ids.index(res["ruleId"]) != res.get("ruleIndex"):
                problems.append("result's ruleId/ruleIndex do not name a rule: %s" % res.get("ruleId"))
            if not res.get("locations"):
                problems.append("result without a location: %s" % res["message"]["text"])
            fp = res.get("partialFingerprints")
            if not fp:
                problems.append("result without partialFingerprints")
            else:
                key = json.dumps(fp, sort_keys=True)
                if key in fingerprints:
                    problems.append("two results share a fingerprint: %s" % key)
                fingerprints.add(key)
            for loc in res.get("locations", []) + res.get("relatedLocations", []):
                if "region" not in loc.get("physicalLocation", {}):
                    problems.append("location without a region")
    for p in problems:
        print(p)
    print("%d problem(s)" % len(problems))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
