"""Lets the templates one render starts share the lazy copy of the variables they all read.

ansible-core renders a variable that holds Jinja (a role's derived variable, `spark_nodes` say) in a template of
its own, with a new lazy copy of every variable in scope (a few hundred per task here): each such render copies
them all again, and renders again whatever derived variable it reads, though the render that asked for it
rendered the same one a moment before. spark_nodes reads spark_tp_group, which reads spark_site_groups, which
reads spark_group_names: four copies and four renders for one `{{ spark_nodes }}`, repeated for spark_head and
spark_workers in the same expression. In a no-change site.yml about 5,400 renders a run copied the variables
afresh, a sixth of the workers' CPU.

Here the renders that one top-level render starts (the nested ones, with the same variables and the same
templating engine) are given the lazy copy that render made, so a derived variable is rendered once per
top-level render, as it already is when a template names it twice itself. Nothing changes between those
renders: the variables of a task are fixed while one of its values renders (a loop's item, a retry's result
are set between renders, each of which starts again), and a render with other variables or another engine (a
lookup's template with its own variables or delimiters) gets a copy of its own, as before. A top-level
render's copy goes when the render is done.
"""

from __future__ import annotations

import threading

from ansible.plugins.callback import CallbackBase

try:
    from ansible._internal._templating import _jinja_bits
    from ansible._internal._templating._lazy_containers import _AnsibleLazyTemplateMixin
    from ansible._internal._templating._utils import TemplateContext
    from ansible.module_utils._internal._datatag import _AnsibleTaggedDict
except ImportError:  # another ansible-core: leave its templating alone rather than guess its internals
    _jinja_bits = None

DOCUMENTATION = """
    name: spark_template_layers
    type: aggregate
    short_description: one lazy copy of the variables per top-level render, shared by the renders it starts
    description:
      - ansible-core gives every nested render (a variable whose value holds Jinja) a new lazy copy of every
        variable in scope. This plugin lets the nested renders of one top-level render, with the same variables
        and templating engine, share the copy that render made.
      - Has no output and changes nothing on any host; it needs no enabling.
    options:
      copy_per_render:
        description:
          - A new copy for every render, as ansible-core makes them, at its cost.
        type: bool
        default: false
        env:
          - name: SPARK_COPY_VARS_PER_RENDER
        ini:
          - section: spark_template_layers
            key: copy_per_render
"""

_original_flatten_and_lazify_vars = _jinja_bits._flatten_and_lazify_vars if _jinja_bits else None  # noqa: SLF001
# Per thread: the top-level TemplateContext of the last render (`top`) and its copies (`layers`:
# {(id(variables), id(engine)): (variables, engine, copy)}); a new top-level render starts with none. The context,
# variables and engine are held so that no other object can take their ids meanwhile.
_kept = threading.local()


def _top_level(context):
    while context._parent_ctx is not None:  # noqa: SLF001 - ansible-core keeps no public link to it
        context = context._parent_ctx  # noqa: SLF001
    return context


def _shared_flatten_and_lazify_vars(mapping):
    if type(mapping) in (dict, _AnsibleTaggedDict) and mapping:
        context = TemplateContext.current(optional=True)
        if context is not None:
            top = _top_level(context)
            if getattr(_kept, "top", None) is not top:
                _kept.top, _kept.layers = top, {}
            engine = context.templar
            key = (id(mapping), id(engine))
            kept = _kept.layers.get(key)
            if kept is None or kept[0] is not mapping or kept[1] is not engine:
                kept = _kept.layers[key] = (mapping, engine, _AnsibleLazyTemplateMixin._try_create(mapping))  # noqa: SLF001
            yield kept[2]
            return
    yield from _original_flatten_and_lazify_vars(mapping)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_template_layers"
    CALLBACK_NEEDS_ENABLED = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # Set in the main process before any task: the workers it forks inherit the module as it is then.
        if _jinja_bits is not None:
            _jinja_bits._flatten_and_lazify_vars = (  # noqa: SLF001
                _original_flatten_and_lazify_vars if self.get_option("copy_per_render")
                else _shared_flatten_and_lazify_vars)
