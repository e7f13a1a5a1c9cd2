"""A service catalog of K2.5 endpoints as OpenRouter lists them, and the routing decision on it."""
from eagledata.openrouter import Catalog, PrecisionPolicy, decide

REASONING = ["reasoning", "include_reasoning", "max_tokens", "temperature", "tools", "tool_choice"]


def ep(name, quant, prompt, completion, status=0, params=REASONING, tag=None, uptime=99.0, tps=40.0):
    return {"provider_name": name, "tag": tag or name.lower().replace(" ", ""), "quantization": quant,
            "pricing": {"prompt": None if prompt is None else str(prompt / 1e6),
                        "completion": None if completion is None else str(completion / 1e6)},
            "context_length": 262144, "max_completion_tokens": 65536, "status": status,
            "uptime_last_30m": uptime, "throughput_last_30m": {"p50": tps}, "latency_last_30m": {"p50": 1.2},
            "supported_parameters": params}


def catalog(*extra):
    eps = [ep("DeepInfra", "int4", 0.45, 2.20), ep("Moonshot AI", "int4", 0.60, 2.50),
           ep("Venice", "unknown", 0.80, 3.00), ep("Fireworks", "nvfp4", 0.40, 2.00),
           ep("BaseTen", "fp4", 0.45, 2.10, status=-2), *extra]
    return Catalog("moonshotai/kimi-k2.5", "test", "now", eps)


def decision_for(cat, **kw):
    return decide(cat.model, cat.normalized(), PrecisionPolicy.for_model(cat.model, **kw))
