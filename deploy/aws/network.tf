# A VPC with private subnets in every zone (primaries; routers and load generators), one public
# subnet with a NAT gateway for package installs, and an S3 gateway endpoint. Or an existing VPC
# by id, in which the private subnets are made from vpc_cidr and use private_route_table_id
# (which must route to a NAT).

resource "aws_vpc" "fleet" {
  count                = var.vpc_id == null ? 1 : 0
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = var.name }
}

locals {
  vpc_id = var.vpc_id != null ? var.vpc_id : aws_vpc.fleet[0].id
  # The public subnet takes the range after the private ones.
  public_subnet = cidrsubnet(var.vpc_cidr, 8, 255)
}

resource "aws_subnet" "primary" {
  count             = length(var.azs)
  vpc_id            = local.vpc_id
  availability_zone = var.azs[count.index]
  cidr_block        = module.layout.primary_subnets[count.index]
  tags              = { Name = "${var.name}-primaries-${var.azs[count.index]}" }
}

resource "aws_subnet" "client" {
  count             = length(var.azs)
  vpc_id            = local.vpc_id
  availability_zone = var.azs[count.index]
  cidr_block        = module.layout.client_subnets[count.index]
  tags              = { Name = "${var.name}-routers-${var.azs[count.index]}" }
}

resource "aws_internet_gateway" "fleet" {
  count  = var.vpc_id == null ? 1 : 0
  vpc_id = local.vpc_id
}

resource "aws_subnet" "public" {
  count             = var.vpc_id == null ? 1 : 0
  vpc_id            = local.vpc_id
  availability_zone = var.azs[0]
  cidr_block        = local.public_subnet
  tags              = { Name = "${var.name}-public" }
}

resource "aws_route_table" "public" {
  count  = var.vpc_id == null ? 1 : 0
  vpc_id = local.vpc_id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.fleet[0].id
  }
}

resource "aws_route_table_association" "public" {
  count          = var.vpc_id == null ? 1 : 0
  subnet_id      = aws_subnet.public[0].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_eip" "nat" {
  count  = var.vpc_id == null ? 1 : 0
  domain = "vpc"
}

resource "aws_nat_gateway" "fleet" {
  count         = var.vpc_id == null ? 1 : 0
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
  depends_on    = [aws_internet_gateway.fleet]
}

resource "aws_route_table" "private" {
  count  = var.vpc_id == null ? 1 : 0
  vpc_id = local.vpc_id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.fleet[0].id
  }
}

locals {
  private_route_table_id = var.vpc_id == null ? aws_route_table.private[0].id : var.private_route_table_id
}

resource "aws_route_table_association" "primary" {
  count          = length(var.azs)
  subnet_id      = aws_subnet.primary[count.index].id
  route_table_id = local.private_route_table_id

  lifecycle {
    precondition {
      condition     = var.vpc_id == null || var.private_route_table_id != null
      error_message = "with vpc_id, give private_route_table_id: a route table of that VPC with a route to a NAT."
    }
  }
}

resource "aws_route_table_association" "client" {
  count          = length(var.azs)
  subnet_id      = aws_subnet.client[count.index].id
  route_table_id = local.private_route_table_id
}

resource "aws_vpc_endpoint" "s3" {
  count             = var.vpc_id == null ? 1 : 0
  vpc_id            = local.vpc_id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private[0].id]
}
