"""The network a stack asks for, as a typed value: the profile's `network` section (`NetworkSettings`, a
field of the run spec) and, with the stack and region added, what the network stage ensures
(`NetworkSpec`, pcflow.aws.network).

One model validates both, so the first task refuses a bad CIDR with the setting's path
(`network.vpc_cidr: ...`) before anything is created, and the network task, which builds its spec from
the same section, meets the same rules. It sits apart from the stage (no boto3, no Airflow operator) so
the run spec can hold the section without loading the stage.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pcflow.aws.clients import validate_region
from pcflow.aws.ssh_ingress import refuse_anywhere
from pcflow.errors import ConfigurationError, profile_setting, refused
from pcflow.naming import validate_stack_name
from pcflow.patterns import AVAILABILITY_ZONE

#: The settings that are lists of strings: a YAML scalar where a list was meant is refused, not split.
LISTS = ("private_subnet_cidrs", "ssh_ingress_cidrs", "private_subnet_ids")


class NetworkSettings(BaseModel):
    """The profile's `network` section: a VPC pcflow makes for the stack (its CIDRs, a NAT gateway, one
    compute subnet per fallback zone) or one it adopts by id, and who may reach the head node's SSH port.
    Validated as a whole: CIDRs inside the VPC's range and apart from each other."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vpc_cidr: str = Field("10.42.0.0/16", description="the VPC's range, /16 to /28")
    public_subnet_cidr: str = Field("10.42.0.0/20", description="the head node's subnet (compute's too without NAT)")
    private_subnet_cidrs: tuple[str, ...] = Field(
        ("10.42.128.0/18",), description="compute's subnets behind the NAT gateway (with nat_gateway only)"
    )
    availability_zone: str | None = Field(None, description="the network's zone; None: the region's first")
    zone_subnet_cidrs: dict[str, str] = Field(
        default_factory=dict, description="zone -> CIDR: a compute subnet in each other zone a capacity option names"
    )
    nat_gateway: bool = False
    s3_endpoint: bool = Field(True, description="an S3 gateway endpoint, so dataset traffic skips NAT")
    allow_ssh_from_anywhere: bool = Field(False, description="the admin's explicit yes to 0.0.0.0/0 in ssh_ingress")
    ssh_ingress_cidrs: tuple[str, ...] = Field((), description="who may reach the head node's SSH port")
    vpc_id: str | None = Field(None, description="adopt this VPC (pcflow adds only its security groups there)")
    public_subnet_id: str | None = Field(None, description="an adopted VPC's head node subnet")
    private_subnet_ids: tuple[str, ...] = Field((), description="an adopted VPC's compute subnets")

    @field_validator(*LISTS, mode="before")
    @classmethod
    def _a_list(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            raise ConfigurationError(f"{info.field_name} must be a list, not the string {value!r}")
        return value

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_range(cls, value: str) -> str:
        if not 16 <= _cidr(value, "vpc_cidr").prefixlen <= 28:
            raise ConfigurationError(f"vpc_cidr {value} must have a prefix between /16 and /28 (AWS limit)")
        return value

    @field_validator("public_subnet_cidr", "private_subnet_cidrs", "ssh_ingress_cidrs")
    @classmethod
    def _cidrs(cls, value: str | tuple[str, ...], info: ValidationInfo) -> str | tuple[str, ...]:
        for cidr in (value,) if isinstance(value, str) else value:
            _cidr(cidr, info.field_name)
        return value

    @field_validator("ssh_ingress_cidrs")
    @classmethod
    def _ssh_ingress(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        refuse_anywhere(value, info.data.get("allow_ssh_from_anywhere", False), "the list")
        return value

    @field_validator("zone_subnet_cidrs")
    @classmethod
    def _zones(cls, value: dict[str, str]) -> dict[str, str]:
        for zone, cidr in value.items():
            if not AVAILABILITY_ZONE.fullmatch(zone):
                raise ConfigurationError(f"{zone!r} is not an availability zone (such as us-east-1b)")
            _cidr(cidr, f"zone_subnet_cidrs[{zone}]")
        return dict(sorted(value.items()))

    @property
    def adopted(self) -> bool:
        """A VPC named by id: its owner's, never created or deleted by pcflow."""
        return self.vpc_id is not None

    @model_validator(mode="after")
    def _layout(self) -> NetworkSettings:
        if self.adopted:
            if self.zone_subnet_cidrs:
                raise ConfigurationError(
                    "zone_subnet_cidrs: an adopted VPC's subnets are its owner's; pcflow adds none"
                )
            if not self.public_subnet_id:
                raise ConfigurationError("adopting vpc_id needs public_subnet_id (the head node's subnet) as well")
            return self
        if self.public_subnet_id or self.private_subnet_ids:
            raise ConfigurationError("subnet ids can only be given together with vpc_id (adopting an existing VPC)")
        check_layout(self.vpc_cidr, self.subnet_cidrs())
        return self

    def subnet_cidrs(self) -> dict[str, str]:
        """The subnets pcflow makes, by the setting that names each."""
        subnets = {"public_subnet_cidr": self.public_subnet_cidr}
        if self.nat_gateway:
            if not self.private_subnet_cidrs:
                raise ConfigurationError("nat_gateway=True needs at least one private_subnet_cidrs entry for compute")
            subnets |= {f"private_subnet_cidrs[{i}]": c for i, c in enumerate(self.private_subnet_cidrs)}
        return subnets | {f"zone_subnet_cidrs[{zone}]": c for zone, c in self.zone_subnet_cidrs.items()}


def check_layout(vpc_cidr: str, subnets: Mapping[str, str]) -> None:
    """Subnets lie inside the VPC's range and do not overlap each other: what EC2 would refuse halfway
    through making the network, refused before it starts."""
    vpc = _cidr(vpc_cidr, "vpc_cidr")
    nets = {name: _cidr(cidr, name) for name, cidr in subnets.items()}
    for name, net in nets.items():
        if net.version != vpc.version or not net.subnet_of(vpc):
            raise ConfigurationError(f"{name} {net} is not inside vpc_cidr {vpc}; choose a range within it")
    names = list(nets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if nets[a].overlaps(nets[b]):
                raise ConfigurationError(f"CIDR overlap: {a} {nets[a]} overlaps {b} {nets[b]}")


class NetworkSpec(NetworkSettings):
    """What the network stage ensures: the section's settings in one stack and region. Validated on
    construction, before any AWS call."""

    stack: str
    region: str

    @field_validator("stack")
    @classmethod
    def _stack(cls, value: str) -> str:
        return validate_stack_name(value)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        return validate_region(value)

    @classmethod
    def of(cls, stack: str, region: str, settings: NetworkSettings | Mapping[str, Any] | None) -> NetworkSpec:
        """From the `network` section (the run spec's, or as it travels through XCom): a bad or unknown
        setting is refused naming its path, as the profile admin's to fix."""
        values = settings.model_dump() if isinstance(settings, NetworkSettings) else dict(settings or {})
        unknown = sorted(set(values) - set(NetworkSettings.model_fields))
        if unknown:
            allowed = sorted(NetworkSettings.model_fields)
            raise refused("network", f"unknown network setting(s) {unknown}; allowed: {allowed}", profile_setting())
        try:
            return cls(stack=stack, region=region, **values)
        except ValidationError as exc:
            error = exc.errors()[0]
            path = [str(part) for part in error["loc"]]
            where = ".".join(path if path[:1] in (["stack"], ["region"]) else ["network", *path])
            raise refused(where, str(error.get("ctx", {}).get("error") or error["msg"]), profile_setting()) from None


def _cidr(value: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value, strict=True)
    except (ValueError, TypeError) as error:
        raise ConfigurationError(f"invalid CIDR {value!r} in {what}: {error}") from None
