"""S3 listing pages are read by `s3_store.parse_listing_page` (the C XML parser in botocore's `before-parse` hook)
instead of botocore's parser, which cost ~65 ms of CPU per page of 1000 keys (issue 22): the same objects, sizes,
times, common prefixes and continuation as botocore's own parse, on SeaweedFS."""

from __future__ import annotations

import time

from botocore.parsers import BaseXMLResponseParser

from kafscale_lakehouse.storage import namespace_prefix
from kafscale_lakehouse.testing.servers import S3_BUCKET
from kafscale_lakehouse_tests.storage.conftest import make_s3_store


def test_listing_pages_read_by_the_fast_parser_equal_botocores(seaweedfs, unique_prefix, monkeypatch):
    store = make_s3_store(seaweedfs, unique_prefix, list_page_size=7)
    prefix = namespace_prefix(unique_prefix)
    # Keys botocore URL-decodes after the parse (spaces, '+', '%', unicode) and sizes from 0 up.
    names = [f"orders/{p}/segment-{i:020d}.kfs" for p in range(3) for i in range(6)]
    names += ["odd topic/0/a+b%20c.kfs", "odd topic/0/zürich.index", "orders/empty"]
    for number, name in enumerate(names):
        store.put(f"{prefix}{name}", b"x" * number)

    parsed_by_botocore: list[bytes] = []
    parse = BaseXMLResponseParser._parse_xml_string_to_dom
    monkeypatch.setattr(BaseXMLResponseParser, "_parse_xml_string_to_dom",
                        lambda self, text: parsed_by_botocore.append(text) or parse(self, text))
    fast = list(store.list_objects(prefix))
    assert parsed_by_botocore and not any(b"<Contents>" in text for text in parsed_by_botocore), \
        "botocore parsed the pages' objects itself"
    monkeypatch.undo()
    client = seaweedfs.s3_client()  # a plain boto3 client: botocore's own parser
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix,
                                                             PaginationConfig={"PageSize": 7})
    slow = [(item["Key"], item["Size"], item["LastModified"]) for page in pages for item in page.get("Contents", [])]

    assert [(o.key, o.size, o.last_modified) for o in fast] == slow
    assert len(fast) == len(names) and store.request_counts["list"] == 3  # 21 keys in pages of 7
    assert store.list_common_prefixes(prefix) == [f"{prefix}odd topic/", f"{prefix}orders/"]
    assert store.list_topics() == ["odd topic", "orders"]
    started = fast[0].last_modified
    assert started.tzinfo is not None and abs(started.timestamp() - time.time()) < 600
