"""The grammar of the workbook's NDJSON monitoring records (metric / log / alert / deploy), compiled
from a JSON Schema built from the corpus generator's own vocabularies (lessonkit.workloads.corpus)."""
from __future__ import annotations

from lessonkit.grammar.automaton import Grammar
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.workloads import corpus as c


def monitoring_record_schema() -> dict:
    """JSON Schema of the corpus's NDJSON monitoring records (metric / log / alert / deploy), from corpus.py."""
    def obj(props: dict, optional=()) -> dict:
        return {"type": "object", "properties": props, "additionalProperties": False,
                "required": [k for k in props if k not in optional]}

    s, i, n = {"type": "string"}, {"type": "integer"}, {"type": "number"}
    services = {"enum": sorted(c.SERVICES)}
    teams = {"enum": sorted({t for t, _ in c.SERVICES.values()})}
    regions = {"enum": sorted(c.REGIONS)}
    env = {"enum": ["prod", "staging", "dev"]}
    ts = {"type": "string", "format": "date-time"}
    metric = obj({"ts": ts, "type": {"const": "metric"}, "host": s, "service": services, "region": regions,
                  "metric": {"enum": [m[0] for m in c.METRICS]}, "value": n,
                  "unit": {"enum": sorted({m[1] for m in c.METRICS})},
                  "tags": obj({"env": env, "az": s, "team": teams})})
    log = obj({"ts": ts, "type": {"const": "log"}, "level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
               "service": services, "host": s, "logger": s, "msg": s,
               "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
               "route": {"enum": sorted({r for _, routes in c.SERVICES.values() for r in routes})},
               "status": i, "duration_ms": i}, optional=("route", "status", "duration_ms"))
    alert = obj({"ts": ts, "type": {"const": "alert"}, "alert_id": {"type": "string", "format": "uuid"},
                 "rule": {"enum": [r[0] for r in c.RULES]},
                 "severity": {"enum": ["info", "warning", "critical", "page"]},
                 "status": {"enum": ["firing", "resolved"]}, "service": services, "host": s, "region": regions,
                 "metric": {"enum": sorted({r[1] for r in c.RULES})}, "value": n, "threshold": n, "summary": s,
                 "labels": obj({"env": env, "team": teams})})
    deploy = obj({"ts": ts, "type": {"const": "deploy"}, "service": services, "env": env, "from_version": s,
                  "to_version": s, "commit": {"type": "string", "pattern": "^[0-9a-f]{7}$"},
                  "actor": {"enum": list(c.ACTORS)}, "status": {"enum": ["succeeded", "failed", "rolled_back"]},
                  "duration_s": i})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "monitoring record",
            "anyOf": [metric, log, alert, deploy]}


def monitoring_grammar(*, whitespace: str = "compact", ndjson: bool = True) -> Grammar:
    return schema_grammar(monitoring_record_schema(), whitespace=whitespace, ndjson=ndjson,
                          source="monitoring_record_schema()")
