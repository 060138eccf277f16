#!/usr/bin/env python3
"""Holds api/openapi.json to the daemon's own verdicts on producer frames.

Usage: schemacheck.py OPENAPI CASES

CASES is a JSON array of {"name", "body", "accepted", "schema"}: each body a
producer frame (text) and whether the daemon's ingress validation accepted
it, or an answer of the daemon's (accepted true), as openapi_test.go wrote
them. Each body is validated against the document's schema named by
"schema" (components.schemas; Frame when absent) with the jsonschema package (JSON Schema 2020-12, the dialect
OpenAPI 3.1 uses); every case whose verdict differs from the daemon's is
printed, one line each, and the exit status is 1 when there is any.

Numbers written with a fraction or an exponent are read as decimals, not
floats: JSON Schema's "integer" takes 1.0 as an integer, while the daemon
reads the number's text and refuses it, as the document says in prose.

Exit status 3 means the validator is missing (the Go test skips, or fails
under CI=true).
"""

import decimal
import json
import sys

try:
    import jsonschema
    from jsonschema import Draft202012Validator
except ImportError:  # pragma: no cover - reported to the Go test
    print("the jsonschema package is not installed (Debian: python3-jsonschema)", file=sys.stderr)
    sys.exit(3)

try:
    from referencing import Registry, Resource  # jsonschema >= 4.18
except ImportError:
    Registry = None


def validator_for(doc, name):
    """A validator of the document's schema name (components.schemas), its
    $refs resolved within the document."""
    if Registry is not None:
        root = dict(doc)
        root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        resource = Resource.from_contents(root)
        registry = Registry().with_resource("urn:openapi", resource)
        return Draft202012Validator({"$ref": "urn:openapi#/components/schemas/" + name}, registry=registry)
    resolver = jsonschema.RefResolver.from_schema(doc)
    return Draft202012Validator({"$ref": "#/components/schemas/" + name}, resolver=resolver)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    for name, schema in doc["components"]["schemas"].items():
        try:
            Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            print(f"components.schemas.{name} is not a JSON Schema 2020-12 schema: {e.message}")
            return 1
    validators = {}
    disagreements = 0
    for c in cases:
        name = c.get("schema") or "Frame"
        if name not in validators:
            validators[name] = validator_for(doc, name)
        frame = json.loads(c["body"], parse_float=decimal.Decimal)
        errors = list(validators[name].iter_errors(frame))
        if (not errors) != c["accepted"]:
            disagreements += 1
            why = errors[0].message if errors else "the schema accepts it"
            verdict = "accepts" if c["accepted"] else "refuses"
            print(f"{c['name']}: the daemon {verdict} it, the schema does not agree ({why[:200]})")
    print(f"{len(cases)} frames checked, {disagreements} disagreements", file=sys.stderr)
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
