"""Sites and Words: a frame carried as a value until a renderer labels it, and the one way it becomes text."""

from __future__ import annotations

import pickle

import numpy as np

from snapanalyze.sites import NO_FRAMES, Site, site_codes, site_of, site_text, words, words_text


def test_a_site_is_labelled_as_the_tables_show_frames() -> None:
    assert Site.of(("/home/me/app/model.py", 7, "forward"), "Block.forward").label() == \
        "me/app/model.py:7:Block.forward"
    assert Site.of(("/home/me/app/model.py", 7, "forward")).label() == "me/app/model.py:7:forward"
    assert Site.of(("/x/lib/python3.11/site-packages/torch/nn/f.py", 3, "linear"), lines=False).label() == \
        "torch/nn/f.py:linear"
    assert Site.of(("??", 0, "at::native::mm(at::Tensor const&)")).label() == "at::native::mm"
    assert site_of(None) is None and site_text(None) == "" and site_text(None, none=NO_FRAMES) == NO_FRAMES


def test_a_renderer_chooses_how_a_site_shows_its_file() -> None:
    site = Site.of(("/home/alice/proj/model.py", 12, "forward"))
    assert site.label(lambda p: "[h]/" + p.rsplit("/", 1)[-1]) == "[h]/model.py:12:forward"
    native = Site.of(("/src/c10/Alloc.cpp", 40, "c10::malloc(unsigned long)"))
    assert native.label(lambda p: "never called") == "c10::malloc"       # a native frame shows no file


def test_native_frames_of_one_symbol_are_one_site() -> None:
    a = Site.of(("/src/aten/Blas.cpp", 10, "at::cuda::gemm(float)"))
    b = Site.of(("/src/aten/Blas.cpp", 99, "at::cuda::gemm(double)"))
    assert a == b and hash(a) == hash(b)
    frames = {0: a, 1: b, 2: Site.of(("/p/m.py", 1, "f")), 3: None}
    codes, sites = site_codes(np.array([2, 0, 1, 3, 2, 0]), frames.__getitem__)
    assert codes.tolist() == [0, 1, 1, 2, 0, 1] and sites == [frames[2], a, None]
    empty, none = site_codes(np.zeros(0, dtype=np.int64), frames.__getitem__)
    assert len(empty) == 0 and none == []


def test_words_name_sites_and_render_them_with_the_renderers_path() -> None:
    site = Site.of(("/home/alice/proj/optimizer.py", 73, "step"))
    said = words("freed inside the optimizer step (", site, "): state", "", None, " it replaced")
    assert said == ("freed inside the optimizer step (", site, "): state it replaced")
    assert words_text(said) == "freed inside the optimizer step (alice/proj/optimizer.py:73:step): state it replaced"
    assert words_text(said, lambda p: "[h]/optimizer.py") == \
        "freed inside the optimizer step ([h]/optimizer.py:73:step): state it replaced"
    assert pickle.loads(pickle.dumps(said)) == said                     # a worker's result carries them
