"""The Agent Protocol as LangGraph's SDKs call it, under /langgraph/.

Every path the pinned langgraph-sdk calls is routed: to a working view, or to
a refusal that says why (docs/langgraph-clients.md lists them).
"""

from django.urls import path, re_path

from agent_protocol.views import assistants, runs, service, threads
from agent_protocol.views.base import refusal
from runs.api.errors import api_not_found

STORE = refusal(
    "the store is not supported: keep what an agent remembers in its thread's "
    "state, which is encrypted and deleted with the thread"
)
CRONS = refusal("scheduled runs (crons) are not supported")
STATELESS = refusal(
    "runs without a thread are not supported: create a thread, run on it, and "
    "delete it when done"
)
THREAD_STREAM = refusal(
    "streaming a whole thread is not supported: join a run's stream "
    "(GET /threads/{thread_id}/runs/{run_id}/stream)"
)
PRUNE = refusal(
    "threads are pruned and expired by the tenant's retention policy, not over this API"
)
BATCH = refusal("batches of runs are not supported: create each run on its thread")

urlpatterns = [
    path("ok", service.OkView.as_view()),
    path("info", service.InfoView.as_view()),
    # Assistants
    path("assistants", assistants.AssistantCreateView.as_view()),
    path("assistants/search", assistants.AssistantSearchView.as_view()),
    path("assistants/count", assistants.AssistantCountView.as_view()),
    path("assistants/<str:assistant_id>", assistants.AssistantDetailView.as_view()),
    path(
        "assistants/<str:assistant_id>/graph", assistants.AssistantGraphView.as_view()
    ),
    path(
        "assistants/<str:assistant_id>/schemas",
        assistants.AssistantSchemasView.as_view(),
    ),
    path(
        "assistants/<str:assistant_id>/subgraphs",
        assistants.AssistantSubgraphsView.as_view(),
    ),
    path(
        "assistants/<str:assistant_id>/subgraphs/<str:namespace>",
        assistants.AssistantSubgraphsView.as_view(),
    ),
    path(
        "assistants/<str:assistant_id>/versions",
        assistants.AssistantVersionsView.as_view(),
    ),
    path(
        "assistants/<str:assistant_id>/latest",
        assistants.AssistantLatestView.as_view(),
    ),
    # Threads
    path("threads", threads.ThreadCreateView.as_view()),
    path("threads/search", threads.ThreadSearchView.as_view()),
    path("threads/count", threads.ThreadCountView.as_view()),
    path("threads/prune", PRUNE.as_view()),
    path("threads/<str:thread_id>", threads.ThreadDetailView.as_view()),
    path("threads/<str:thread_id>/copy", threads.ThreadCopyView.as_view()),
    path("threads/<str:thread_id>/state", threads.ThreadStateView.as_view()),
    path(
        "threads/<str:thread_id>/state/checkpoint",
        threads.ThreadStateAtCheckpointView.as_view(),
    ),
    path(
        "threads/<str:thread_id>/state/<str:checkpoint_id>",
        threads.ThreadStateView.as_view(),
    ),
    path("threads/<str:thread_id>/history", threads.ThreadHistoryView.as_view()),
    path("threads/<str:thread_id>/stream", THREAD_STREAM.as_view()),
    path("threads/<str:thread_id>/stream/events", THREAD_STREAM.as_view()),
    path("threads/<str:thread_id>/commands", THREAD_STREAM.as_view()),
    # Runs
    path("threads/<str:thread_id>/runs", runs.ThreadRunsView.as_view()),
    path("threads/<str:thread_id>/runs/wait", runs.ThreadRunWaitView.as_view()),
    path("threads/<str:thread_id>/runs/stream", runs.ThreadRunStreamView.as_view()),
    path("threads/<str:thread_id>/runs/crons", CRONS.as_view()),
    path("threads/<str:thread_id>/runs/<uuid:run_id>", runs.RunDetailView.as_view()),
    path(
        "threads/<str:thread_id>/runs/<uuid:run_id>/cancel",
        runs.RunCancelView.as_view(),
    ),
    path("threads/<str:thread_id>/runs/<uuid:run_id>/join", runs.RunJoinView.as_view()),
    path(
        "threads/<str:thread_id>/runs/<uuid:run_id>/stream",
        runs.RunJoinStreamView.as_view(),
    ),
    path("runs", STATELESS.as_view()),
    path("runs/wait", STATELESS.as_view()),
    path("runs/stream", STATELESS.as_view()),
    path("runs/batch", BATCH.as_view()),
    path("runs/cancel", runs.RunsCancelView.as_view()),
    path("runs/crons", CRONS.as_view()),
    path("runs/crons/search", CRONS.as_view()),
    path("runs/crons/count", CRONS.as_view()),
    path("runs/crons/<str:cron_id>", CRONS.as_view()),
    # Store
    path("store/items", STORE.as_view()),
    path("store/items/search", STORE.as_view()),
    path("store/namespaces", STORE.as_view()),
    # Anything else: the API's JSON 404, never a page.
    re_path(r"^", api_not_found),
]
