"""The side-by-side benchmark's report: the issue's table, goals and details.

`report(settings, results)` turns what bench/peers.py measured into the
Markdown section of docs/benchmarks.md; nothing here measures anything.
"""

from __future__ import annotations

import statistics
from itertools import pairwise

ENGINES = ("gatehouse", "dbos", "floor")
TITLES = {
    "gatehouse": "Gatehouse",
    "dbos": "DBOS 3.4",
    "floor": "LangGraph + PostgresSaver",
}


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or not theirs:
        return "–"
    return f"{mine / theirs:.2f}×"


def rate(window: dict | None) -> float | None:
    if window is None:
        return None
    return window["completed"] / (window["ended"] - window["started"])


def processes(count: int) -> str:
    return f"{count} worker process{'es' if count > 1 else ''}"


def _row(label: str, cells: list[str], gatehouse, dbos) -> str:
    return f"| {label} | {' | '.join(cells)} | {ratio(gatehouse, dbos)} |"


def latency_row(label: str, measure: str, latency: dict) -> str:
    cells, p50 = [], {}
    for engine in ENGINES:
        figure = latency[engine].get(measure)
        if figure is None:
            cells.append("–")
            continue
        p50[engine] = figure["p50"]
        cells.append(f"{ms(figure['p50'])} (p95 {ms(figure['p95'])})")
    return _row(label, cells, p50.get("gatehouse"), p50.get("dbos"))


def throughput_rows(results: dict, runs: int, concurrency: int) -> list[str]:
    rows = []
    for workers, windows in results["throughput"].items():
        cells, rates = [], {}
        for engine in ENGINES:
            window = windows.get(engine)
            rates[engine] = rate(window)
            cell = "–" if window is None else f"{rates[engine]:.1f}"
            if window and window["failures"]:
                cell += f" ({len(window['failures'])} failed)"
            cells.append(cell)
        label = (
            f"complete runs/s, {runs} runs at concurrency {concurrency}, "
            f"{processes(workers)}"
        )
        rows.append(_row(label, cells, rates["gatehouse"], rates["dbos"]))
    slow = results.get("slow_poll")
    if slow:
        first = results["throughput"][min(results["throughput"])]
        mine = rate(slow["window"])
        rows.append(
            _row(
                f"the same, 1 worker process, the Gatehouse client polling every "
                f"{slow['interval'] * 1000:g} ms",
                [f"{mine:.1f}", "", ""],
                mine,
                rate(first.get("dbos")),
            )
        )
    return rows


PER_RUN = (
    ("rows inserted per complete run", "inserted"),
    ("rows updated per complete run", "updated"),
    ("transactions per complete run", "transactions"),
    ("of which wrote a row", "write_transactions"),
    ("round trips per complete run (Sync or Query)", "round_trips"),
)


def per_run_rows(counts: dict, status_cost: dict | None) -> list[str]:
    rows = []
    for label, key in PER_RUN:
        values = {engine: counts[engine][key] for engine in counts}
        cells = [
            "–" if engine not in values else f"{values[engine]:.1f}"
            for engine in ENGINES
        ]
        rows.append(_row(label, cells, values.get("gatehouse"), values.get("dbos")))
    if status_cost and "gatehouse" in counts:
        gatehouse = counts["gatehouse"]
        for label, key in (
            (
                "transactions per complete run, without the status checks",
                "transactions",
            ),
            ("round trips per complete run, without the status checks", "round_trips"),
        ):
            without = gatehouse[key] - gatehouse["status_calls"] * status_cost[key]
            rows.append(
                _row(
                    label,
                    [f"{without:.1f}", "", ""],
                    without,
                    counts.get("dbos", {}).get(key),
                )
            )
    return rows


def goals(results: dict) -> list[str]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    latency, counts = results["latency"], results["counts"]
    lines = []
    for measure, label in (
        ("decision_to_succeeded", "decision → run succeeded"),
        ("start_to_waiting", "start → waiting for approval"),
    ):
        mine = latency["gatehouse"][measure]["p50"]
        theirs = latency["dbos"][measure]["p50"]
        lines.append(
            f"- {verdict(mine <= 1.5 * theirs)}: {label} p50 at most 1.5× DBOS's "
            f"({mine / theirs:.2f}×)"
        )
    if results["throughput"]:
        first = results["throughput"][min(results["throughput"])]
        mine, theirs = rate(first["gatehouse"]), rate(first["dbos"])
        lines.append(
            f"- {verdict(mine >= theirs)}: throughput with one worker process at "
            f"least DBOS's ({mine:.1f} vs {theirs:.1f} runs/s)"
        )
    if len(results["throughput"]) > 1:
        scaling = [
            rate(windows["gatehouse"]) for windows in results["throughput"].values()
        ]
        lines.append(
            f"- {verdict(all(b > a for a, b in pairwise(scaling)))}: "
            "throughput grows with worker processes ("
            + " → ".join(f"{value:.1f}" for value in scaling)
            + " runs/s; on 2 cores shared with Postgres and the web tier)"
        )
    if "gatehouse" in counts and "floor" in counts:
        for label, value in (
            ("rows written (inserted + updated)", _written),
            ("transactions", lambda count: count["transactions"]),
        ):
            mine, floor = value(counts["gatehouse"]), value(counts["floor"])
            lines.append(
                f"- {verdict(mine <= 1.3 * floor)}: {label} per run within 1.3× of "
                f"the floor's ({mine:.1f} vs {floor:.1f}, {mine / floor:.2f}×)"
            )
    return lines


def _written(count: dict) -> float:
    return count["inserted"] + count["updated"]


def table_detail(counts: dict) -> list[str]:
    lines = []
    for engine, count in counts.items():
        ranked = sorted(
            count["tables"].items(), key=lambda item: -(item[1][0] + item[1][1])
        )
        parts = [
            f"`{name}` {inserted:g}+{updated:g}"
            for name, (inserted, updated, _) in ranked
            if inserted + updated >= 0.05
        ]
        lines.append(f"- {TITLES[engine]}: {', '.join(parts)}.")
    return lines


def statement_detail(counts: dict, shown: int = 12) -> list[str]:
    lines = []
    for engine, count in counts.items():
        ranked = sorted(count["statement_kinds"].items(), key=lambda item: -item[1])
        parts = [
            f"{kind} {per_run:.1f}"
            for kind, per_run in ranked[:shown]
            if per_run >= 0.05
        ]
        lines.append(f"- {TITLES[engine]}: {', '.join(parts)}.")
    return lines


def web_detail(timings: dict) -> list[str]:
    total = sum(sum(times) for times in timings.values())
    if not total:
        return ["(no requests recorded)"]
    lines = [
        "| request | count | time p50 (as the client saw it) | share of request time |",
        "|---|---:|---:|---:|",
    ]
    for name, times in sorted(timings.items(), key=lambda item: -sum(item[1])):
        lines.append(
            f"| {name} | {len(times)} | {statistics.median(times) * 1000:.1f} ms | "
            f"{sum(times) / total * 100:.0f} % |"
        )
    return lines


def run_timing_detail(results: dict) -> list[str]:
    lines = []
    for workers, windows in results["throughput"].items():
        window = windows["gatehouse"]
        runs = [run for sample in window["samples"] for run in sample["runs"]]
        if not runs:
            continue
        done = window["completed"] or 1
        lines.append(
            f"- {processes(workers)}: runs waited "
            f"{statistics.fmean(r['queued'] for r in runs) * 1000:.0f} ms on average "
            "to be claimed and then executed for "
            f"{statistics.fmean(r['executing'] for r in runs) * 1000:.0f} ms; "
            "status requests per complete run "
            f"{statistics.fmean(s['status_calls'] for s in window['samples']):.1f}; "
            f"CPU per complete run: web {window['cpu']['web'] / done * 1000:.0f} ms, "
            f"workers {window['cpu']['workers'] / done * 1000:.0f} ms."
        )
    return lines


ANATOMY_TITLES = {
    "start_to_waiting": "start → waiting for approval",
    "decision_to_succeeded": "decision → run succeeded",
    "start POST": "start POST, as the web process served it",
    "decision POST": "decision POST, as the web process served it",
}


def anatomy_detail(anatomy: dict) -> list[str]:
    """Each timeline's phases (bench/peers_anatomy.py), p50 beside the whole."""
    lines = [
        f"Phases of Gatehouse's latencies, one run at a time ({anatomy['flows']} "
        "flows of the latency rounds; from the timestamps its runs, audit "
        "events, checkpoints and tool calls record and the client's clock; a "
        "phase is the time between two consecutive marks and holds whatever "
        "happened between them; the p50s of the phases need not add up to the "
        "whole's, and a phase seen in fewer flows (n) is an order of marks "
        "that varies):",
        "",
    ]
    for name, title in ANATOMY_TITLES.items():
        timeline = anatomy["timelines"][name]
        whole = timeline["whole"]
        lines += [
            f"| {title} (whole: p50 {ms(whole)}) | p50 | share of the whole | n |",
            "|---|---:|---:|---:|",
        ]
        for phase in timeline["phases"]:
            lines.append(
                f"| {phase['phase']} | {ms(phase['p50'])} | "
                f"{phase['p50'] / whole * 100:.0f} % | {phase['n']} |"
            )
        lines.append("")
    return lines[:-1]


def _setup_lines(settings: dict) -> list[str]:
    waiter = {
        "poll": f"polls the run's status every {settings['poll_interval'] * 1000:g} ms",
        "join": "waits on the Agent Protocol's runs/join, then reads the run's status",
    }.get(settings["wait"], "waits on the run's GET with `?wait=30` (a long poll)")
    return [
        f"- Machine: {settings['machine']}; load average {settings['load_start']} "
        f"at the start, {settings['load_end']} at the end (the machine is shared: "
        "whatever else ran fell on the three engines alike, in turns).",
        f"- Versions: {settings['versions']}.",
        f"- Gatehouse: production mode, `{settings['web_server']}` web server "
        f"({settings['web_workers']} gunicorn workers), Celery worker processes of "
        "2 pool processes each on Redis, Postgres, no beat; the client (this "
        f"script, HTTP/1.1 keep-alive) {waiter}. DBOS: one process starting "
        "workflows, `get_event` for the approval, `send()` for the decision, "
        "`get_result()`. Floor: the same five-node graph in-process with "
        'PostgresSaver, `durability="sync"`.',
        f"- Latency: {settings['rounds']} rounds × {settings['per_round']} runs per "
        "engine, one at a time, one worker process. Throughput: "
        f"{settings['throughput_runs']} runs at concurrency "
        f"{settings['concurrency']}. Per-run counts: {settings['count_runs']} runs "
        "per engine, one at a time, through a counting proxy of the Postgres "
        "protocol (bench/peers_pgcount.py; the Gatehouse client checking "
        f"status every {settings['count_poll_interval'] * 1000:g} ms there).",
    ]


def _count_note(results: dict) -> list[str]:
    counts, cost = results["counts"], results.get("status_cost")
    gatehouse = counts.get("gatehouse")
    if gatehouse is None:
        return []
    text = (
        f"Gatehouse's client made {gatehouse['requests']:.1f} requests per run in "
        f"the count, {gatehouse['status_calls']:.1f} of them status checks"
    )
    if cost:
        text += (
            f"; one status check costs {cost['transactions']:.1f} transactions "
            f"and {cost['round_trips']:.1f} round trips"
        )
        if cost.get("p50") is not None:
            text += f", {ms(cost['p50'])} as the client sees it (p50, one at a time)"
    background = counts.get("dbos", {}).get("background_transactions", 0.0)
    text += (
        f". DBOS's idle background (its queue and notification pollers: "
        f"{background:.1f} transactions/s) is subtracted from its counts."
    )
    return ["", text]


def report(settings: dict, results: dict) -> str:
    mode = "quick" if settings["quick"] else "full"
    lines = [
        f"## Side by side, {mode} run (`bench/peers.py`)",
        "",
        f"`make bench-peers{' ARGS=--quick' if settings['quick'] else ''}`, run "
        f"{settings['when']}.",
        "",
        *_setup_lines(settings),
        "",
        "| measure | Gatehouse | DBOS 3.4 | LangGraph + PostgresSaver | "
        "Gatehouse ÷ DBOS |",
        "|---|---|---|---|---|",
        latency_row(
            "decision → run succeeded, p50", "decision_to_succeeded", results["latency"]
        ),
        latency_row(
            "start → waiting for approval, p50", "start_to_waiting", results["latency"]
        ),
        latency_row(
            "decision POST alone / `send()` alone, p50",
            "decision_call",
            results["latency"],
        ),
        *throughput_rows(results, settings["throughput_runs"], settings["concurrency"]),
        *per_run_rows(results["counts"], results.get("status_cost")),
        "",
        "Goals (issue 15):",
        "",
        *goals(results),
        "",
        *anatomy_detail(results["anatomy"]),
        "",
        "Rows per complete run, by table (inserted+updated):",
        "",
        *table_detail(results["counts"]),
        "",
        "Statements per complete run, the most frequent kinds:",
        "",
        *statement_detail(results["counts"]),
        *_count_note(results),
    ]
    if results["throughput"]:
        first = min(results["throughput"])
        lines += [
            "",
            "Gatehouse under load (throughput phase):",
            "",
            *run_timing_detail(results),
            "",
            f"Web requests in the throughput phase with {processes(first)} "
            "(each request timed by the client: the server's time plus any queueing "
            "for a web worker):",
            "",
            *web_detail(results["throughput"][first]["gatehouse"]["web"]),
        ]
    return "\n".join(lines) + "\n"
