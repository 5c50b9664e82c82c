"""Config models: unknown keys name the key and the file; ASTRAFLOW_* variables; client settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import KafkaSettings, load_recipe
from astraflow.errors import ConfigError
from astraflow.kafka import client_config, consumer_config, producer_config
from astraflow.kafka_faust import faust_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_unknown_key_is_an_error_naming_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfeeder:\n  group_sise: 3\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(path) in str(info.value)
    assert "unknown key 'feeder.group_sise'" in str(info.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: x\npolicies: [{name: 'bad name'}]\n", "policies.0.name"),
        ("name: x\npolicies: [{name: a}, {name: a}]\n", "unique"),
        ("name: x\nmodel: {hidden_size: 100, num_heads: 3}\n", "multiple of num_heads"),
        ("name: x\nmax_staleness: -1\n", "max_staleness"),
        ("policies: []\n", "missing required key 'name'"),
        ("name: x\nkafka: {security_protocol: TELNET}\n", "kafka.security_protocol"),
        ("- just\n- a list\n", "mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_broken_recipes_are_refused_clearly(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_recipe(write(tmp_path, text))
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # the second temperature knob is gone: the error names the key and where the setting lives
        ("name: x\ntrainer:\n  loss: {temperature: 0.7}\n", "trainer.loss.temperature was removed"),
        ("name: x\ntrainer:\n  loss: {temperature: 0.7}\n", "worker.temperature"),
        # greedy decoding cannot be trained on
        ("name: x\nworker: {temperature: 0}\n", "worker.temperature"),
        ("name: x\nworker: {temperature: 0}\n", "greedy"),
        ("name: x\nworker: {top_k: -1}\n", "worker.top_k"),
        (
            "name: x\nworker: {top_p: 0.9}\ntrainer: {loss: {kl_coef: 0.1}}\n",
            "kl_coef > 0 needs worker.top_p: 1",
        ),
    ],
)
def test_sampling_settings_are_defined_once_and_trainable(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, text))
    assert words in str(info.value) and str(tmp_path) in str(info.value)


def test_a_policy_changes_its_own_trainers_loss_only(tmp_path: Path) -> None:
    text = (
        "name: x\npolicies: [{name: a}, {name: b, loss: {entropy_target: 0.5}}]\n"
        "trainer: {lr: 0.001, loss: {clip_high: 0.3}}\n"
    )
    recipe = load_recipe(write(tmp_path, text))
    a, b = recipe.trainer_for("a"), recipe.trainer_for("b")
    assert a.loss.entropy_target is None and b.loss.entropy_target == 0.5
    assert a.loss.clip_high == b.loss.clip_high == 0.3 and a.lr == b.lr == 0.001  # the rest is shared
    for loss, words in (
        ("{entropy_targt: 0.5}", "policies.b.loss: unknown key 'entropy_targt'"),
        ("{entropy_target: -1}", "policies.b.loss: entropy_target"),
    ):
        with pytest.raises(ConfigError) as info:
            load_recipe(write(tmp_path, f"name: x\npolicies: [{{name: a}}, {{name: b, loss: {loss}}}]\n"))
        assert words in str(info.value), str(info.value)
    # one policy's KL needs full-support sampling too
    bad = "name: x\npolicies: [{name: a, loss: {kl_coef: 0.1}}]\nworker: {top_p: 0.9}\n"
    with pytest.raises(ConfigError, match="kl_coef > 0 needs"):
        load_recipe(write(tmp_path, bad))


def test_a_policy_changes_its_own_trainers_keys(tmp_path: Path) -> None:
    text = (
        "name: x\npolicies: [{name: a, trainer: {lr: 0.0001}, loss: {kl_coef: 0.05}}, {name: b}]\n"
        "trainer: {lr: 0.001, batch_groups: 4, loss: {clip_high: 0.3}}\n"
    )
    recipe = load_recipe(write(tmp_path, text))
    a, b = recipe.trainer_for("a"), recipe.trainer_for("b")
    assert (a.lr, b.lr) == (0.0001, 0.001) and (a.loss.kl_coef, b.loss.kl_coef) == (0.05, 0.0)
    assert a.batch_groups == b.batch_groups == 4 and a.loss.clip_high == b.loss.clip_high == 0.3
    for trainer, words in (
        ("{lr: -1}", "policies.a.trainer: lr: Input should be greater than 0"),
        ("{lrr: 0.1}", "policies.a.trainer: unknown key 'lrr'"),
        ("{loss: {kl_coef: 0.1}}", "policies.a.trainer: the loss keys go in policies.a.loss"),
        ("{batch_groups: 2}", "policies.a.trainer: batch_groups must be the same for every policy"),
    ):
        with pytest.raises(ConfigError) as info:
            load_recipe(write(tmp_path, f"name: x\npolicies: [{{name: a, trainer: {trainer}}}]\n"))
        assert words in str(info.value), str(info.value)


def test_worker_sampling_settings_load() -> None:
    from astraflow.config import Recipe
    from astraflow.sampling import SamplingSettings

    recipe = Recipe.model_validate({"name": "x", "worker": {"temperature": 0.7, "top_p": 0.9, "top_k": 20}})
    assert SamplingSettings.of(recipe.worker) == SamplingSettings(temperature=0.7, top_p=0.9, top_k=20)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_recipe(tmp_path / "nope.yaml")


def test_environment_overrides_the_recipe() -> None:
    env = {
        "ASTRAFLOW_BOOTSTRAP": "b1:9093,b2:9093",
        "ASTRAFLOW_SECURITY_PROTOCOL": "SASL_SSL",
        "ASTRAFLOW_SASL_USERNAME": "eu-worker",
        "ASTRAFLOW_SASL_PASSWORD": "s3cret",
        "ASTRAFLOW_SSL_CA_LOCATION": "/etc/ca.pem",
        "ASTRAFLOW_REGION": "eu-west",
        "ASTRAFLOW_NAMESPACE": "run7",
    }
    s = KafkaSettings.from_env({"bootstrap": "local:9092", "region": "us"}, environ=env)
    assert s.bootstrap == "b1:9093,b2:9093" and s.region == "eu-west"
    assert s.topic("samples.solver") == "run7.samples.solver" and s.group("workers") == "run7.workers"
    conf = client_config(s)
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "eu-worker" and conf["sasl.password"] == "s3cret"
    assert conf["ssl.ca.location"] == "/etc/ca.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    assert "s3cret" not in repr(s)


def test_bad_environment_value_names_the_source() -> None:
    with pytest.raises(ConfigError, match="security_protocol"):
        KafkaSettings.from_env({}, environ={"ASTRAFLOW_SECURITY_PROTOCOL": "SMOKE_SIGNALS"})


def test_producer_and_consumer_guarantees() -> None:
    s = KafkaSettings(bootstrap="h:1", namespace="ns")
    p = producer_config(s)
    assert p["enable.idempotence"] is True and p["acks"] == "all"
    c = consumer_config(s, "workers")
    assert c["group.id"] == "ns.workers"
    assert c["enable.auto.offset.store"] is False  # offsets stored only after processing
    assert c["auto.offset.reset"] == "earliest"
    # an empty fetch is held 100 ms locally, not librdkafka's 500: the consumer's metadata and
    # end-offset requests wait behind it; over a WAN, fewer round trips matter more
    assert c["fetch.wait.max.ms"] == 100
    assert consumer_config(KafkaSettings(bootstrap="h:1", wan=True), "w")["fetch.wait.max.ms"] == 500


def test_faust_gets_the_same_connection() -> None:
    import ssl

    import faust

    s = KafkaSettings(
        bootstrap="b1:9093, b2:9093",
        security_protocol="SASL_SSL",
        sasl_username="u",
        sasl_password="p",
        ssl_ca_location=ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt",
    )
    kw = faust_settings(s)
    assert kw["broker"] == ["kafka://b1:9093", "kafka://b2:9093"]
    creds = kw["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.username == "u" and creds.mechanism.value == "SCRAM-SHA-512"
    assert creds.ssl_context.check_hostname is True
    assert "broker_credentials" not in faust_settings(KafkaSettings(bootstrap="h:1"))


# ---------------------------------------------------------------- the engine union


def test_the_engine_section_is_typed_by_its_type(tmp_path: Path) -> None:
    from astraflow.config.worker import SGLangEngineConfig, TorchEngineConfig

    assert load_recipe(write(tmp_path, "name: x\n")).worker.engine == TorchEngineConfig()
    torch_engine = load_recipe(
        write(tmp_path, "name: x\nworker: {engine: {args: {seed: 3, dtype: bfloat16}}}\n")
    )
    assert isinstance(torch_engine.worker.engine, TorchEngineConfig)  # `type` left out: torch
    assert (torch_engine.worker.engine.args.seed, torch_engine.worker.engine.args.dtype) == (3, "bfloat16")
    text = "name: x\nworker: {engine: {type: sglang, args: {urls: {policy: 'http://h:1'}, timeout_s: 5}}}\n"
    sglang = load_recipe(write(tmp_path, text)).worker.engine
    assert isinstance(sglang, SGLangEngineConfig)
    assert sglang.args.urls == {"policy": "http://h:1"} and sglang.args.timeout_s == 5.0


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ("{type: vllm}", "worker.engine: unknown type 'vllm'; known: torch, sglang"),
        ("torch", "worker.engine: expected a mapping with a `type`"),
        ("{type: torch, args: {devise: cuda}}", "unknown key 'worker.engine.torch.args.devise'"),
        (
            "{type: torch, args: {url: 'http://h:1'}}",
            "unknown key 'worker.engine.torch.args.url'",
        ),  # sglang's
        ("{type: sglang, args: {max_batch: 8}}", "unknown key 'worker.engine.sglang.args.max_batch'"),
        ("{type: torch, args: {dtype: float8}}", "worker.engine.torch.args.dtype"),
        ("{type: sglang, args: {timeout_s: 0}}", "worker.engine.sglang.args.timeout_s"),
    ],
)
def test_bad_engine_sections_fail_when_the_recipe_loads(tmp_path: Path, engine: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, f"name: x\nworker:\n  engine: {engine}\n"))
    assert words in str(info.value) and str(tmp_path) in str(info.value), str(info.value)


def test_build_engine_uses_the_typed_arguments() -> None:
    from astraflow.config.worker import SGLangArgs, SGLangEngineConfig
    from workers.engines import build_engine
    from workers.engines.sglang_engine import SGLangEngine

    config = SGLangEngineConfig(type="sglang", args=SGLangArgs(url="http://h:1", urls={"b": "http://h:2"}))
    a, b = build_engine(config, "a", "/m"), build_engine(config, "b", "/m")
    assert isinstance(a, SGLangEngine) and a.url == "http://h:1"
    assert isinstance(b, SGLangEngine) and b.url == "http://h:2"
    with pytest.raises(ConfigError, match="no SGLang url for policy 'a'"):
        build_engine(SGLangEngineConfig(type="sglang"), "a", "/m")
