"""Validate rendered Kubernetes manifests: core kinds against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict), custom resources against the schemas in deploy/k8s/schemas/.

    kubectl kustomize --load-restrictor=LoadRestrictionsNone deploy/k8s/overlays/cpu \
        | python deploy/k8s/validate_manifests.py -

A kind with no schema either way is an error, not a warning: kubernetes-validate alone skips
unknown kinds, which would let a CRD typo (or a misspelled core kind) through.
Exit status 0 when every resource validates, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

SCHEMA_DIR = Path(__file__).with_name("schemas")
KUBERNETES_VERSION = "1.30.0"  # oldest version we support; fields newer than it are errors


def local_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> JSON schema, read from the `const`s of each schema file."""
    schemas = {}
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        schema = json.loads(path.read_text())
        props = schema["properties"]
        schemas[(props["apiVersion"]["const"], props["kind"]["const"])] = schema
    return schemas


def validate_resource(resource: dict[str, Any], schemas: dict, version: str) -> str | None:
    """None when valid, else a message naming the resource and the problem."""
    key = (resource.get("apiVersion", ""), resource.get("kind", ""))
    name = f"{key[1]}/{resource.get('metadata', {}).get('name', '?')} ({key[0]})"
    if key in schemas:
        errors = sorted(
            jsonschema.Draft7Validator(schemas[key]).iter_errors(resource), key=lambda e: e.path
        )
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path)
            return f"{name}: {where}: {errors[0].message}"
        return None
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return f"{name}: no schema in Kubernetes {version} nor in {SCHEMA_DIR}"
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"{name}: {where}: {exc.message}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="YAML files ('-' = stdin)")
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    schemas = local_schemas()
    failures = checked = 0
    for file in args.files:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        for resource in yaml.safe_load_all(text):
            if not resource:
                continue
            checked += 1
            problem = validate_resource(resource, schemas, args.kubernetes_version)
            if problem:
                failures += 1
                print(f"FAIL {problem}")
    print(f"{checked - failures} of {checked} resources valid")
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
