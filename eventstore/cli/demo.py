"""The `eventstore demo` command and its data: a realistic harness session (a todo-app
build with an init plan, 20 features, runs with progress, checkpoints and transcript)
written through the ordinary session API, so a new user has something to look at.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import msgspec

from eventstore.cli.args import (
    EXIT_OK,
    Subparsers,
    add_command,
    add_full,
)
from eventstore.cli.format import (
    emit_json,
    render_state,
)
from eventstore.cli.store import (
    open_store,
    shown_root,
)
from eventstore.records import (
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
)
from eventstore.store import SessionStore

__all__ = ["DEMO_FEATURES", "add_parser", "run", "write_demo"]


def add_parser(sub: Subparsers) -> None:
    """Register `demo`."""
    p = add_command(
        sub,
        "demo",
        run,
        "write a realistic harness session and print its state",
        "  eventstore demo\n  eventstore demo --root other-store --session demo-2",
    )
    p.add_argument("--root", default=".eventstore", help="store root (default ./.eventstore)")
    p.add_argument(
        "--session", default="demo", help="session id (default: demo); rerun to add a run"
    )
    add_full(p)


def run(args: argparse.Namespace) -> int:
    """Write (or continue) the demo session and print its bootstrap state."""
    shown = shown_root(args)
    with open_store(args, create=True) as store:
        sid = args.session
        created = write_demo(store, sid)
        state = store.load_bootstrap_state(sid)
        last = store.last_seq(sid)
        if args.json:
            emit_json(
                {
                    "session_id": sid,
                    "root": shown,
                    "created": created,
                    "last_seq": last,
                    "state": state,
                }
            )
            return EXIT_OK
        verb = "wrote a new" if created else "continued the"
        print(f"{verb} demo session {sid!r} in {shown} ({last} events)\n")
        print(render_state(sid, state, args.full, f"seq {last}"))
        print(f"\nnext: eventstore log {shown} {sid}  |  eventstore verify {shown} {sid}")
    return EXIT_OK


DEMO_FEATURES = [
    ("auth-001", "auth", "A visitor can sign up with email and password"),
    ("auth-002", "auth", "A user can log in and log out"),
    ("auth-003", "auth", "A wrong password shows an error and no session is created"),
    ("todo-001", "todos", "A user can add a todo with a title"),
    ("todo-002", "todos", "A user can mark a todo done and undone"),
    ("todo-003", "todos", "A user can edit a todo's title inline"),
    ("todo-004", "todos", "A user can delete a todo, with undo for five seconds"),
    ("todo-005", "todos", "Todos persist across page reloads"),
    ("list-001", "lists", "A user can create named lists"),
    ("list-002", "lists", "A user can move a todo between lists"),
    ("list-003", "lists", "Deleting a list asks for confirmation"),
    ("ui-001", "ui", "The empty state explains how to add the first todo"),
    ("ui-002", "ui", "Keyboard shortcuts: n (new), e (edit), x (done)"),
    ("ui-003", "ui", "The layout works at 360 px width"),
    ("ui-004", "ui", "Dark mode follows the system setting"),
    ("api-001", "api", "GET /api/todos returns the user's todos as JSON"),
    ("api-002", "api", "POST /api/todos validates the title (1..200 chars)"),
    ("api-003", "api", "The API answers 401 without a session cookie"),
    ("perf-001", "performance", "The first page renders in under one second on 3G"),
    ("a11y-001", "accessibility", "Every control has an accessible name (axe: 0 violations)"),
]


def write_demo(store: SessionStore, sid: str) -> bool:
    """Run the demo harness against `sid`: initialize (True) or add one more run (False)."""
    # a run of about 35 minutes that ends now: realistic, never-future record times
    now = datetime.now(UTC) - timedelta(minutes=35)
    features = [
        FeatureRecord(
            id=i, category=c, description=d, steps=["open the app", f"check: {d}"], passes=False
        )
        for i, c, d in DEMO_FEATURES
    ]
    manifest = _demo_manifest(sid)
    created = store.initialize_session_if_missing(
        sid,
        manifest,
        features,
        initial_progress_entry=ProgressEntry(
            run_id="run-1",
            summary="Initializer: wrote the feature list and init.sh",
            created_at=now,
        ),
        initial_checkpoint=RunCheckpoint(run_id="run-1", started_at=now),
    )
    state = store.load_bootstrap_state(sid)
    run = len({c.run_id for c in state.checkpoints}) + (0 if created else 1)
    run_id = f"run-{run}"
    if not created:
        store.record_run_checkpoint(sid, RunCheckpoint(run_id=run_id, started_at=now))
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id, summary="Resumed from the bootstrap state", created_at=now
            ),
        )
    store.append_transcript_messages(
        sid,
        [
            Message(
                role=Role.SYSTEM, content="You are a coding agent. Work on one feature at a time."
            ),
            Message(
                role=Role.USER,
                content=f"Continue the todo app ({run_id}). Read the progress notes first.",
            ),
        ],
    )
    todo = _pass_features(store, sid, run_id, now)
    end = now + timedelta(minutes=35)
    if todo[4:]:
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id,
                summary=f"{todo[4].id} started; flaky selector, left for the next run",
                created_at=end,
            ),
        )
    manifest = store.load_bootstrap_state(sid).manifest or manifest
    store.save_manifest(
        sid, msgspec.structs.replace(manifest, last_known_good_commit=f"{0x3F9C2AB + run:07x}")
    )
    store.record_run_checkpoint(
        sid,
        RunCheckpoint(
            run_id=run_id,
            started_at=now,
            completed_at=end,
            status=RunStatus.SUCCEEDED if todo[4:] or not todo else RunStatus.FAILED,
            note=f"{min(4, len(todo))} features flipped to passing",
        ),
    )
    store.append_transcript_messages(
        sid, [Message(role=Role.ASSISTANT, content=f"Done with {run_id}; progress notes updated.")]
    )
    return created


def _demo_manifest(sid: str) -> SessionManifest:
    """The demo session's manifest: a todo app's MVP, with its init plan."""
    return SessionManifest(
        session_id=sid,
        active_branch="feature/todo-mvp",
        current_objective="Build the todo web app MVP: every feature in the list passes end to end",
        last_known_good_commit=None,
        init_plan=InitPlan(
            steps=[
                InitCommand(program="npm", args=["ci"]),
                InitShellScript(shell=InitShell.BASH, script="npm run db:migrate && npm run build"),
                InitCommand(program="npx", args=["playwright", "install", "chromium"]),
            ]
        ),
        metadata={"repo": "github.com/example/todo", "model": "demo-agent-1"},
    )


def _pass_features(
    store: SessionStore, sid: str, run_id: str, now: datetime
) -> list[FeatureRecord]:
    """The run's work: the first four features still failing pass, seven minutes apart,
    each with its transcript and progress note. Returns the features failing before."""
    todo = [f for f in store.load_bootstrap_state(sid).feature_list if not f.passes]
    for k, feature in enumerate(todo[:4]):
        t = now + timedelta(minutes=7 * (k + 1))
        store.append_transcript_messages(
            sid,
            [
                Message(
                    role=Role.ASSISTANT,
                    content=f"Implementing {feature.id}: {feature.description}.",
                ),
                Message(
                    role=Role.TOOL, content=f"$ npx playwright test {feature.id}\n1 passed (2.1s)"
                ),
            ],
        )
        store.update_feature_pass(sid, feature.id, True)
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id, summary=f"{feature.id} passes end to end; committed", created_at=t
            ),
        )
    return todo
