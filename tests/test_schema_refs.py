"""References across embedded resources (`$id` below the root), resolved as JSON Schema 2020-12 does;
jsonschema is the oracle for every text checked here."""
import json

import jsonschema
import pytest

from lessonkit.errors import LessonkitError
from lessonkit.grammar.json_refs import resolve_references
from lessonkit.grammar.json_schema import schema_grammar

NESTED_POINTER = {"$id": "http://example.com/a.json",
                  "$defs": {"inner": {"type": "integer"}},
                  "properties": {"foo": {"$id": "b.json", "$defs": {"inner": {"type": "string"}},
                                         "$ref": "#/$defs/inner"}},
                  "$ref": "b.json"}
ANCHORS = {"$id": "http://example.com/root", "$ref": "child1#my_anchor",
           "$defs": {"A": {"$id": "child1", "allOf": [{"$id": "child2", "$anchor": "my_anchor", "type": "number"},
                                                      {"$anchor": "my_anchor", "type": "string"}]}}}
URN = {"$ref": "urn:uuid:deadbeef-4321-ffff-ffff-1234feebdaed",
       "$defs": {"foo": {"$id": "urn:uuid:deadbeef-4321-ffff-ffff-1234feebdaed",
                         "$defs": {"bar": {"type": "string"}}, "$ref": "#/$defs/bar"}}}
RECURSIVE = {"$id": "http://example.com/tree", "type": "object", "required": ["nodes"],
             "properties": {"nodes": {"type": "array", "items": {"$ref": "node"}}}, "additionalProperties": False,
             "$defs": {"node": {"$id": "http://example.com/node", "type": "object", "required": ["value"],
                                "properties": {"value": {"type": "integer"}, "subtree": {"$ref": "tree"}},
                                "additionalProperties": False}}}


@pytest.mark.parametrize("schema,texts", [
    (NESTED_POINTER, ['{"foo":"x"}', '{"foo":1}', "{}", '"x"', "1"]),
    (ANCHORS, ['"a"', "1", "null"]),
    (URN, ['"a"', "1"]),
    (RECURSIVE, ['{"nodes":[{"value":1,"subtree":{"nodes":[]}}]}', '{"nodes":[{"value":1,"subtree":{"nodes":[1]}}]}',
                 '{"nodes":[{"value":"x"}]}', '{"nodes":[]}']),
])
def test_nested_id_rebases_references_like_jsonschema(schema, texts):
    g = schema_grammar(schema, whitespace="compact")
    v = jsonschema.Draft202012Validator(schema)
    for t in texts:
        assert g.matches(t.encode()) == v.is_valid(json.loads(t)), t


def test_references_become_document_pointers_and_remote_ones_are_refused_by_name():
    assert resolve_references(NESTED_POINTER)["properties"]["foo"]["$ref"] == "#/properties/foo/$defs/inner"
    assert resolve_references(NESTED_POINTER)["$ref"] == "#/properties/foo"
    plain = {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}
    assert resolve_references(plain) is plain                  # nothing to re-base: the schema itself
    remote = {"$id": "http://example.com/r", "items": {"$id": "sub/", "items": {"$ref": "folderInteger.json"}}}
    with pytest.raises(LessonkitError, match="http://example.com/sub/folderInteger.json"):
        schema_grammar(remote)
    with pytest.raises(LessonkitError, match="not 'other.json'"):
        schema_grammar({"$ref": "other.json"})
