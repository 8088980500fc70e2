"""Ask before you code: a multi-turn coding environment with a simulated user.

Each task statement omits one detail. The simulated user knows the full spec and reveals the
detail only when the agent asks a relevant question; anything else gets a vague answer. A
```python block ends the episode and hidden unit tests, run in `training.sandbox`, score it:

    ep = env.reset(prompt)             # ep.transcript starts as prompt.messages (system + user)
    reply, done = ep.step(agent_msg)   # a question (plain text) or a code submission
    ...                                # until done; then env.score(prompt, ep.transcript)

Modules: `tasks` (the bank, read from tasks.json), `parsing`, `hidden_tests`, `rewards`,
`prompts`, `episode`, `policy` (the scripted agent), `rollouts` (demo records) and `environment`.
The transcript format is in `episode`. The names below stay importable from the package, so
reward versions recorded before the split still resolve to the same functions.
"""

from .environment import AskToCodeEnv
from .episode import OUT_OF_TURNS, VAGUE_ANSWERS, Episode
from .hidden_tests import (
    CACHE_SIZE,
    INFRASTRUCTURE_ERRORS,
    TEST_TIMEOUT_S,
    clear_cache,
    hidden_test_result,
    summarise,
)
from .parsing import agent_turns, extract_code, is_relevant, message_text
from .policy import GOOD_STYLES, STYLES, AgentPolicy, ScriptedAskPolicy, code_message
from .prompts import MAX_TURNS, SYSTEM_PROMPT, stored_prompt, task_messages, task_prompt
from .rewards import (
    COMPONENTS,
    LOOP_SIMILARITY,
    asked_before_coding,
    correctness,
    guessing_penalty,
    loop_penalty,
)
from .rollouts import generate_groups, rollout_record, run_episode
from .tasks import FAMILIES, HOLDOUT_FAMILIES, IRRELEVANT_QUESTIONS, TASKS, TASKS_BY_KEY, Task

__all__ = [
    "CACHE_SIZE",
    "COMPONENTS",
    "FAMILIES",
    "GOOD_STYLES",
    "HOLDOUT_FAMILIES",
    "INFRASTRUCTURE_ERRORS",
    "IRRELEVANT_QUESTIONS",
    "LOOP_SIMILARITY",
    "MAX_TURNS",
    "OUT_OF_TURNS",
    "STYLES",
    "SYSTEM_PROMPT",
    "TASKS",
    "TASKS_BY_KEY",
    "TEST_TIMEOUT_S",
    "VAGUE_ANSWERS",
    "AgentPolicy",
    "AskToCodeEnv",
    "Episode",
    "ScriptedAskPolicy",
    "Task",
    "agent_turns",
    "asked_before_coding",
    "clear_cache",
    "code_message",
    "correctness",
    "extract_code",
    "generate_groups",
    "guessing_penalty",
    "hidden_test_result",
    "is_relevant",
    "loop_penalty",
    "message_text",
    "rollout_record",
    "run_episode",
    "stored_prompt",
    "summarise",
    "task_messages",
    "task_prompt",
]
