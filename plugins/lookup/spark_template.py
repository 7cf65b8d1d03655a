"""Renders role templates the way ansible.builtin.template's lookup does, without copying the host's variables."""

# Ansible plugin layout: the documentation blocks come before the imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = """
    name: spark_template
    short_description: render a template file as the template module would write it
    description:
      - Returns the text of each template file, rendered with the task's variables, found the way the template
        module finds it (the role's C(templates/) first). The roles compare its checksum with the file on a node,
        so that a file that is in place costs no write task.
      - The same text as C(ansible.builtin.template)'s lookup. That lookup deep-copies every variable of the host
        for each file it renders (about 0.1 CPU-s each here, dozens of times per run); this one puts the template's
        own variables (C(template_*), C(ansible_managed), I(template_vars)) in a layer above them instead.
    options:
      _terms:
        description: The template files.
        required: true
      template_vars:
        description: Variables for these templates only, above every other.
        type: dict
        default: {}
"""

EXAMPLES = """
- name: Checksum of the unit as the template module would write it
  ansible.builtin.debug:
    msg: "{{ lookup('dgx_spark.llm_serving.spark_template', 'server.service.j2') | hash('sha1') }}"
"""

RETURN = """
  _raw:
    description: The rendered text of each template.
    type: list
    elements: str
"""

import os
from collections import ChainMap

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible.template import generate_ansible_template_vars, trust_as_template


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        variables = variables or {}
        own = self.get_option("template_vars")
        rendered = []
        for term in terms:
            path = self.find_file_in_search_path(variables, "templates", term)
            if not path:
                raise AnsibleError(f"the template {term!r} is in no templates directory of the role or the play")
            # Includes inside the template are looked up beside it, then where the task's own search path says.
            searchpath = [os.path.dirname(path)]
            for base in variables.get("ansible_search_path", []):
                searchpath += [os.path.join(base, "templates"), base]
            template_vars = generate_ansible_template_vars(term, path)
            if "ansible_managed" in variables:  # a site's own ansible_managed wins, as with the template module
                del template_vars["ansible_managed"]
            templar = self._templar.copy_with_new_env(available_variables=ChainMap(own, template_vars, variables),
                                                      searchpath=searchpath)
            source = trust_as_template(self._loader.get_text_file_contents(path))
            rendered.append(templar.template(source, escape_backslashes=False, preserve_trailing_newlines=True))
        return rendered
