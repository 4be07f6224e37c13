"""Sphinx configuration of the course site (``make site``; ``course_utils/tooling/site.py`` stages the sources).

The notebooks are rendered by MyST-NB from their committed outputs (never
executed) with sphinx-book-theme: a sidebar in syllabus order (the lectures,
then the lab book), the page's contents, Sphinx's full-text search, download
buttons (the notebook, and a lecture's student version from ``release/``),
launch buttons for Binder and JupyterHub, dark mode. Cells tagged ``evidence``
are left out of the pages (``site.read_page``); the downloads keep them.
Nothing is loaded from the network when a page is viewed: maths uses a local
MathJax 2, and widget outputs show their still image, not the widget.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.errors import ExtensionError

from course_utils.tooling.site import (EXTRA, LAB, MATHJAX_CONFIG, MATHJAX_HUB_CONFIG, RELEASE, course_title,
                                       launch_urls, mathjax_source)

project = course_title()
html_title = project
extensions = ["myst_nb"]
exclude_patterns = [EXTRA, "**.ipynb_checkpoints"]

# Render the committed outputs; never execute.
nb_execution_mode = "off"
# Every notebook is read by site.read_page, which drops the cells tagged "evidence" from the page (in memory).
nb_custom_formats = {".ipynb": ["course_utils.tooling.site.read_page", {}, False]}
myst_enable_extensions = ["dollarmath", "amsmath"]
# A widget (ipywidgets) is not rendered: its output's still image is shown, and no widget JavaScript is loaded.
nb_mime_priority_overrides = [("*", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}

# Maths from the local MathJax 2 (copied into _static/mathjax after the build), with its STIX-Web fonts. MyST-NB
# marks notebook cells tex2jax_ignore and the maths in them with the class "math"; MyST's own MathJax setting
# is written for MathJax 3/4, so the same is said here in MathJax 2's terms.
mathjax_path = f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"
myst_update_mathjax = False
mathjax2_config = {**MATHJAX_HUB_CONFIG,
                   "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area",
                               "ignoreClass": "tex2jax_ignore|mathjax_ignore"}}

repository_url, jupyterhub_url = launch_urls()
html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": repository_url,
    "repository_branch": "main",
    "path_to_docs": "notebooks",  # where the pages' notebooks live in the repository (launch links)
    "use_repository_button": True,
    "use_download_button": True,
    "use_edit_page_button": False,
    "use_source_button": False,
    "use_issues_button": False,
    "launch_buttons": {"binderhub_url": "https://mybinder.org", "jupyterhub_url": jupyterhub_url,
                       "notebook_interface": "jupyterlab"},
    "show_toc_level": 2,
}


def _add_student_version(app, pagename, templatename, context, doctree):
    """Add the student version (``release/NN_name.ipynb``) to a lecture's download menu (the lab book has none)."""
    if context.get("page_source_suffix") != ".ipynb" or pagename.startswith(f"{LAB}/"):
        return
    released = f"{RELEASE}/{pagename}.ipynb"
    if not (Path(app.srcdir) / EXTRA / released).is_file():
        raise ExtensionError(f"no student version {released} in {Path(app.srcdir) / EXTRA} (see site.stage)")
    for group in context["header_buttons"]:
        if group.get("label") == "download-buttons":
            group["buttons"].insert(1, {"type": "link", "url": context["pathto"](released, 1),
                                        "text": "student version", "icon": "fas fa-graduation-cap",
                                        "tooltip": "Download the student version (no solutions, no outputs)",
                                        "label": "download-release-button"})
            return
    raise ExtensionError(f"{pagename}: the theme's download menu is missing (use_download_button)")


def _publish_extra(app, config):
    """Publish the staged ``_extra`` folder (the student notebooks) at the site's top: ``release/NN_name.ipynb``."""
    config.html_extra_path = [str(Path(app.srcdir) / EXTRA)]


def _copy_mathjax(app, exception):
    if exception is None:
        shutil.copytree(mathjax_source(), Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app):
    app.set_html_assets_policy("always")  # MathJax on every page: the sidebar's titles have maths too
    app.connect("config-inited", _publish_extra, priority=100)  # before Sphinx checks the path (800)
    app.connect("html-page-context", _add_student_version, priority=900)  # after the theme's buttons (501)
    app.connect("build-finished", _copy_mathjax)
