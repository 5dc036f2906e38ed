"""The v1 environments' documentation pages, generated from their class docstrings:
``python -m mooncake_gym.reporting.env_docs`` rewrites ``docs/envs/*_v1.md``."""

from __future__ import annotations

import inspect
import pathlib

from mooncake_gym._files import write_atomic
from mooncake_gym import envs


def doc_page(env_cls: type, env_id: str) -> str:
    """The documentation page of a v1 environment (``docs/envs/*_v1.md``): a title and the class
    docstring, which is the page's one source (``tests/test_envs_v1.py`` checks they agree)."""
    return f"# {env_id.split('/')[-1]}\n\n`gym.make(\"{env_id}\")`; source: `{env_cls.__module__}.{env_cls.__name__}` " \
           f"(its docstring is this page).\n\n{inspect.cleandoc(env_cls.__doc__)}\n"


#: (class name, env id, docs page) of the v1 environments.
DOC_PAGES = (("PrefillRoutingV1Env", "mooncake_gym/PrefillRouting-v1", "docs/envs/prefill_routing_v1.md"),
             ("OverloadAdmissionV1Env", "mooncake_gym/OverloadAdmission-v1", "docs/envs/overload_admission_v1.md"),
             ("ConductorV1Env", "mooncake_gym/Conductor-v1", "docs/envs/conductor_v1.md"))


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    for name, env_id, page in DOC_PAGES:
        write_atomic(root / page, doc_page(getattr(envs, name), env_id))
