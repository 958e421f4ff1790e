package resolvers

import (
	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

// The functions below translate engine values into API models. They hold no
// rules: every decision was made by the engine.

func productModel(p inventory.Product) *model.Product {
	out := &model.Product{
		ID: globalID(typeProduct, p.SKU), Sku: p.SKU, Name: p.Name,
		Price:        &model.Money{Amount: int(p.Price.Amount), Currency: p.Price.Currency},
		SaleStartsAt: p.SaleStartsAt, SaleEndsAt: p.SaleEndsAt,
	}
	if p.MaxPerUser > 0 {
		n := p.MaxPerUser
		out.MaxPerUser = &n
	}
	out.DropID = p.Drop
	out.Queued = p.Queued
	return out
}

func dropModel(d inventory.Drop) *model.Drop {
	return &model.Drop{
		ID: globalID(typeDrop, d.ID), DropID: d.ID, Name: d.Name, MaxPerUser: d.MaxPerUser,
		SaleStartsAt: d.SaleStartsAt, SaleEndsAt: d.SaleEndsAt,
	}
}

func stockModel(s inventory.Stock) *model.Stock {
	return &model.Stock{
		ID: globalID(typeStock, s.SKU), Sku: s.SKU, Available: s.Available, Held: s.Held,
		Sold: s.Sold, Total: s.Total, UpdatedAt: s.UpdatedAt,
	}
}

func reservationModel(r inventory.Reservation) *model.Reservation {
	return &model.Reservation{
		ID: globalID(typeReservation, r.Token), Token: r.Token, Sku: r.SKU, Quantity: r.Quantity,
		Status: model.ReservationStatus(r.Status), ExpiresAt: r.ExpiresAt, CreatedAt: r.CreatedAt,
		CommittedAt: r.CommittedAt, Extensions: r.Extensions,
	}
}

func cartModel(c inventory.Cart) *model.Cart {
	out := &model.Cart{
		ID: globalID(typeCart, c.Token), Token: c.Token, Status: model.ReservationStatus(c.Status),
		ExpiresAt: c.ExpiresAt, CreatedAt: c.CreatedAt, Lines: make([]*model.Reservation, len(c.Lines)),
	}
	for i, l := range c.Lines {
		out.Lines[i] = reservationModel(l)
	}
	return out
}

func moneyInput(m *model.MoneyInput) *inventory.Money {
	if m == nil {
		return nil
	}
	return &inventory.Money{Amount: int64(m.Amount), Currency: m.Currency}
}
