-- Extending a hold. extensions counts how many times a reservation's expiry
-- was moved later (each is an 'extend' event of the write-behind, recorded
-- once as a movement of its own): a rebuild from the ledger restores a hold
-- with its latest expiry and with the extensions it has left. The count only
-- rises, so a late event cannot bring an earlier expiry back.
ALTER TABLE reservations ADD COLUMN extensions integer NOT NULL DEFAULT 0 CHECK (extensions >= 0);

ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_kind_check;
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_kind_check
    CHECK (kind IN ('create', 'restock', 'reserve', 'commit', 'cancel', 'expire', 'extend'));
