"""The paper's grid as a plan: Table 1 and the ablations (conf/grid/<name>.yaml) for one model pair, as the Hydra
multiruns that run it, each run with its directory, its examples and what it already holds (scripts/run_grid.py).

A grid file names, per part, the tasks and methods (Table 1 under our protocol and under protocol=paper) or
AdaFuse's knobs and their values (the ablations), and how many examples each task scores. The plan turns them
into sweeps: one multirun per part, method family and slice size, whose runs are composed exactly as run.py
composes them (so a bad setting fails here, before anything runs), and reads each run's directory: a run whose
metrics.json scores every planned example is finished and left out; one with some predictions resumes.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf, open_dict
from tqdm import tqdm

from adafuse.config import AdaFuseConfig
from adafuse.errors import ConfigError
from conf.compose import CONF_DIR, compose_run
from conf.schema import check_pair_name
from eval.results import read_predictions
from eval.runner import settings_of
from eval.tasks import Task, resolve_data_dir

GRIDS = CONF_DIR / "grid"
PARTS = ("table", "paper", "ablations")
# Settings the grid chooses for every run; the command line gives every other one.
OWN = ("task", "method", "protocol", "task.limit", "method.member")


@dataclass
class TablePart:
    tasks: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)  # `single`: each member of the pair alone


@dataclass
class AblationPart:
    tasks: list[str] = field(default_factory=list)
    knobs: dict[str, list] = field(default_factory=dict)  # AdaFuse's knob -> values beside its default


@dataclass
class GridConf:
    table: TablePart = field(default_factory=TablePart)
    paper: TablePart = field(default_factory=TablePart)
    ablations: AblationPart = field(default_factory=AblationPart)
    limits: dict[str, int | None] = field(default_factory=dict)  # task -> the first N examples; absent: all

    def __post_init__(self):
        defaults = AdaFuseConfig().__dict__
        for knob, values in self.ablations.knobs.items():
            if knob not in defaults:
                raise ConfigError(
                    f"ablations.knobs: {knob!r} is not a knob of AdaFuse; its knobs: {', '.join(defaults)}"
                )
            if defaults[knob] in values:
                raise ConfigError(
                    f"ablations.knobs.{knob} holds {defaults[knob]!r}, the default: the default run (Table 1's "
                    "AdaFuse) is every sweep's middle point already, and would be decoded twice"
                )


def load_grid(name: str, searchpath: list[str] = ()) -> GridConf:
    """grid/<name>.yaml of conf/, or of a folder of your own that a `hydra.searchpath=[...]` override of
    `searchpath` adds, typed: an unknown key or knob, or a default value among the ablations, is refused."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:  # not the primary config: Hydra's search path reaches a group option, never a primary config
            values = compose("grids", overrides=[*searchpath, f"+grid={name}"]).grid
        except MissingConfigException:
            known = ", ".join(sorted(p.stem for p in GRIDS.glob("*.yaml")))
            raise ConfigError(f"no grid {name!r} in conf/grid/ or the search path; conf/grid/ holds: {known}") from None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GridConf), values))
    except ConfigError:  # GridConf's own checks
        raise
    except Exception as err:  # OmegaConf's, whose words name the key
        raise ConfigError(f"grid {name!r}: {err}") from None


@dataclass
class Run:
    """One run of the plan: its overrides, directory, how many examples it scores and how many it holds."""

    part: str
    overrides: list[str]  # as the multirun's job gets them: one value each, as Hydra writes it (false -> False)
    run_dir: Path
    examples: int
    done: int = 0  # predictions already in the run directory
    finished: bool = False  # metrics.json scores every planned example
    seconds_per_example: float | None = None  # measured in this run's own predictions


@dataclass
class Sweep:
    """One Hydra multirun: `swept` keys take each of their values, in every combination; `command_line`'s settings
    apply to every run."""

    part: str
    fixed: list[str]
    swept: dict[str, list[str]]
    command_line: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    @property
    def overrides(self) -> list[str]:
        return [*self.fixed, *(f"{k}={','.join(v)}" for k, v in self.swept.items()), *self.command_line]

    def jobs(self) -> list[list[str]]:
        """Each run's overrides, as Hydra's sweeper gives them to the run's job (its own function): the job's run
        directory is named by them, and Hydra writes a value its own way (0.50 as 0.5, false as False)."""
        parsed = OverridesParser.create().parse_overrides(self.overrides)
        (batch,) = BasicSweeper.split_arguments(parsed, None)
        return batch

    def multiruns(self) -> list[list[str]]:
        """The overrides of each multirun that runs what is left: the whole sweep, or where some of its runs are
        finished, each unfinished run on its own (a multirun runs every combination of its values)."""
        left = [r for r in self.runs if not r.finished]
        if len(left) == len(self.runs):
            return [self.overrides]
        return [r.overrides for r in left]


def check_command_line(overrides: list[str]) -> None:
    """The command line sets one value per setting, and none the grid sets itself."""
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_sweep_override():
            raise ConfigError(f"{override.input_line}: the grid sweeps itself; give one value per setting")
        if key.lstrip("+~") in OWN:
            raise ConfigError(
                f"{override.input_line}: the grid sets {key} for each run; choose tasks, methods and slices in the "
                "grid file (conf/grid/), or --limit"
            )


def sweeps(grid: GridConf, parts: list[str], members: int, limit: int | None) -> list[Sweep]:
    """The multiruns that run the grid's `parts` for a pair of `members` models; --limit `limit` overrides the
    grid's. Tasks that score the same slice share a multirun."""

    def limit_of(task: str) -> str:
        value = limit if limit is not None else grid.limits.get(task)
        return "null" if value is None else str(value)

    def by_limit(tasks: list[str]) -> list[tuple[str, list[str]]]:
        return [(n, [t for t in tasks if limit_of(t) == n]) for n in dict.fromkeys(map(limit_of, tasks))]

    out = []
    for part in (p for p in PARTS if p in parts):
        spec = getattr(grid, part)
        protocol = ["protocol=paper"] if part == "paper" else []
        for n, tasks in by_limit(spec.tasks):
            common = {"task": tasks}
            if part == "ablations":
                for knob, values in spec.knobs.items():
                    swept = common | {f"method.{knob}": [_yaml(v) for v in values]}
                    out.append(Sweep(part, ["method=adafuse", f"task.limit={n}"], swept))
                continue
            if "single" in spec.methods:
                swept = {"method.member": [str(k) for k in range(members)]} | common
                out.append(Sweep(part, [*protocol, "method=single", f"task.limit={n}"], swept))
            ensembles = [m for m in spec.methods if m != "single"]
            if ensembles:
                out.append(Sweep(part, [*protocol, f"task.limit={n}"], {"method": ensembles} | common))
    if "ablations" in parts:  # the default run, every sweep's middle point: Table 1's AdaFuse, else its own
        covered = set(grid.table.tasks) if "table" in parts and "adafuse" in grid.table.methods else set()
        for n, tasks in by_limit([t for t in grid.ablations.tasks if t not in covered]):
            out.append(Sweep("ablations", ["method=adafuse", f"task.limit={n}"], {"task": tasks}))
    return out


def _yaml(value) -> str:
    """A knob's value as an override writes it (false, 0.5, 3)."""
    return json.dumps(value)


def plan(sweep_list: list[Sweep], command_line: list[str]) -> list[Sweep]:
    """Each sweep's runs, with `command_line`'s settings, composed as their jobs compose them (every setting
    checked), with their directories read."""
    examples: dict[tuple, int] = {}
    for sweep in sweep_list:
        sweep.command_line = list(command_line)
    jobs = [(sweep, job) for sweep in sweep_list for job in sweep.jobs()]
    for sweep, job in tqdm(jobs, desc="grid: planning", unit="run"):
        cfg = compose_run(*job, hydra=True)
        check_pair_name(cfg.model_pair.name, cfg.hydra.runtime.choices.get("model_pair"))
        run_dir = Path(cfg.hydra.run.dir).absolute()
        with open_dict(cfg):
            del cfg["hydra"]
        settings = settings_of(cfg)
        settings.data.dir = resolve_data_dir(settings.data.dir)
        key = (settings.task.name, settings.data.dir, settings.data.variant, settings.task.limit)
        if key not in examples:
            examples[key] = len(Task(settings.task, settings.data).examples)
        run = Run(sweep.part, job, run_dir, examples[key])
        read_state(run)
        sweep.runs.append(run)
    return sweep_list


def read_state(run: Run) -> None:
    """What the run's directory holds: predictions (and their seconds), and whether metrics.json scores them all."""
    metrics = run.run_dir / "metrics.json"
    if metrics.is_file():
        run.finished = json.loads(metrics.read_text())["n"] >= run.examples
    predictions = run.run_dir / "predictions.jsonl"
    if predictions.is_file():
        records = read_predictions(predictions).values()
        run.done = len(records)
        seconds = [r["stats"].get("run_seconds", r["stats"]["seconds"]) for r in records]
        run.seconds_per_example = sum(seconds) / len(seconds) if seconds else None


def device_of(run_dir: Path) -> str | None:
    """'cuda' or 'cpu': where the run's models decoded (config.yaml's runtime), None if it has not started."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    models = (OmegaConf.load(config).get("runtime") or {}).get("models") or []
    return "cuda" if any(str(m.get("device", "")).startswith("cuda") for m in models) else "cpu"


@dataclass
class Estimate:
    hours: float  # device hours of the runs with a measured rate
    measured: int  # runs left to run that have one
    unmeasured: int  # runs left to run that have none


def estimate(runs: list[Run], device: str, devices_per_job: int) -> Estimate:
    """Device hours left: each unfinished run's examples to decode at the seconds per example measured on `device`
    for its task and method on this pair (its own predictions first, else any run of the plan's with the same task,
    method and protocol), times the devices a job holds."""
    rates: dict[tuple, list[float]] = {}
    for run in runs:
        if run.seconds_per_example is not None and device_of(run.run_dir) == device:
            rates.setdefault(_kind(run), []).append(run.seconds_per_example)
    hours, measured, unmeasured = 0.0, 0, 0
    for run in (r for r in runs if not r.finished):
        own = run.seconds_per_example if device_of(run.run_dir) == device else None
        rate = own if own is not None else _mean(rates.get(_kind(run)))
        if rate is None:
            unmeasured += 1
            continue
        measured += 1
        hours += rate * max(run.examples - run.done, 0) * devices_per_job / 3600
    return Estimate(hours, measured, unmeasured)


def _kind(run: Run) -> tuple:
    """A run's task, method and protocol: runs alike in these decode at alike speeds."""
    parts = run.run_dir.relative_to(run.run_dir.parents[3]).parts  # <task>/<method>/<pair>/<run id>
    return parts[0], parts[1], "protocol=paper" in run.overrides


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None
