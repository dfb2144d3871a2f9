"""STAND-IN for AWS's Price List API (moto 5.2.5 has no `pricing`), in the local stack's moto server.

GetProducts as the AWS Price List API reference documents it (JSON 1.1, target `AWSPriceListService`):
`ServiceCode` (required), `Filters` of type TERM_MATCH/EQUALS (the field's value is the value), CONTAINS
(holds it), ANY_OF/NONE_OF (is one/none of the comma-separated values) on `ServiceCode` or any product
attribute, `FormatVersion` (`aws_v1` only), `MaxResults` (1-100, default 100) and `NextToken`. The answer's
PriceList holds each matching product document as a JSON string. Its products are a dated SAMPLE
(price_list_sample.json: a few EC2 instance types in us-east-1 and eu-west-1, at AWS's published prices),
not AWS's catalogue: a type or region the sample lacks gets an empty PriceList, as AWS answers for a
product it does not sell. The API's other operations are refused as unknown, as for any unknown target.

Requests reach it by their `X-Amz-Target`, ahead of moto's dispatch (which has no backend to route to).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SAMPLE = Path(__file__).with_name("price_list_sample.json")
TARGET = "AWSPriceListService."


class PriceListError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@cache
def products() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(SAMPLE.read_text())["PriceList"])


def matches(product: dict[str, Any], item: dict[str, str]) -> bool:
    """Whether one product passes one filter (an unknown field matches nothing, as on AWS)."""
    kind, field, value = item.get("Type"), item.get("Field"), item.get("Value", "")
    if field == "ServiceCode":
        actual = product["serviceCode"]
    else:
        actual = product["product"]["attributes"].get(field)
    values = [v.strip() for v in value.split(",")]
    tests = {
        "TERM_MATCH": lambda: actual == value,
        "EQUALS": lambda: actual == value,
        "CONTAINS": lambda: actual is not None and value in actual,
        "ANY_OF": lambda: actual in values,
        "NONE_OF": lambda: actual is not None and actual not in values,
    }
    if kind not in tests:
        raise PriceListError("InvalidParameterException", f"Invalid filter type: {kind}")
    return tests[kind]()


def get_products(params: dict[str, Any]) -> dict[str, Any]:
    if not params.get("ServiceCode"):
        raise PriceListError("InvalidParameterException", "ServiceCode is required")
    if params.get("FormatVersion", "aws_v1") != "aws_v1":
        raise PriceListError("InvalidParameterException", f"Invalid FormatVersion: {params['FormatVersion']}")
    size = params.get("MaxResults", 100)
    if not isinstance(size, int) or not 1 <= size <= 100:
        raise PriceListError("InvalidParameterException", "MaxResults must be between 1 and 100")
    filters = [{"Type": "TERM_MATCH", "Field": "ServiceCode", "Value": params["ServiceCode"]}]
    found = [p for p in products() if all(matches(p, f) for f in filters + list(params.get("Filters") or []))]
    token = params.get("NextToken") or "0"
    if not token.isdigit() or int(token) > len(found):
        raise PriceListError("InvalidNextTokenException", "The pagination token is invalid.")
    start = int(token)
    answer: dict[str, Any] = {
        "FormatVersion": "aws_v1",
        "PriceList": [json.dumps(p) for p in found[start : start + size]],
    }
    if start + size < len(found):
        answer["NextToken"] = str(start + size)
    return answer


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """The WSGI application of the Price List API's requests."""
    operation = environ.get("HTTP_X_AMZ_TARGET", "")[len(TARGET) :]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        params = json.loads(environ["wsgi.input"].read(length) or b"{}")
        if operation != "GetProducts":
            raise PriceListError("UnknownOperationException", f"Operation {operation} is not in this stand-in")
        status, body = "200 OK", get_products(params)
    except PriceListError as exc:
        status, body = "400 Bad Request", {"__type": exc.code, "Message": exc.message}
    payload = json.dumps(body).encode()
    headers = [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(payload)))]
    start_response(status, headers)
    return [payload]


def install(dispatcher: type) -> None:
    """Route the Price List API's requests to `app`, ahead of moto's DomainDispatcherApplication."""
    moto_application = dispatcher.get_application

    def get_application(self: Any, environ: dict[str, Any]) -> Any:
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith(TARGET):
            return app
        return moto_application(self, environ)

    dispatcher.get_application = get_application
